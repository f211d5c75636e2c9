"""Where scripts/setup.sh takes torch from: prints pip's index arguments (one a line; none for
pip's own index) on stdout and what it chose, in one line, on stderr. Standard library only: it runs
before anything is installed.

- A Linux x86-64 machine with no NVIDIA driver gets PyTorch's CPU build (~200 MB) from its index,
  not PyPI's default Linux build, which carries CUDA (several GB) that such a machine cannot use.
- When that index cannot be reached within a few seconds (offline, a proxy, a mirror-only
  network), pip's own index is used as before, and the line says so.
- Elsewhere (an NVIDIA GPU, macOS, another architecture) pip's own index is right.

``VOICERT_TORCH_INDEX`` names the CPU index (a mirror, or a stand-in in tests);
``VOICERT_TORCH_GPU=0|1`` overrides the NVIDIA check.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_S = 4.0


def has_nvidia(environ: dict[str, str]) -> bool:
    forced = environ.get("VOICERT_TORCH_GPU", "")
    if forced in ("0", "1"):
        return forced == "1"
    return shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia/version")


def reachable(url: str, timeout: float = PROBE_S) -> bool:
    """Whether ``url`` answers at all within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def choose(
    system: str, machine: str, nvidia: bool, index: str, reach: Callable[[str], bool]
) -> tuple[list[str], str]:
    """(pip's index arguments for torch, the line that says why)."""
    if system != "Linux" or machine not in ("x86_64", "AMD64") or nvidia:
        return [], "setup: torch from pip's index"
    if reach(index.rstrip("/") + "/torch/"):
        return ["--index-url", index], f"setup: no NVIDIA GPU here: torch's CPU build from {index}"
    return [], (
        f"setup: no NVIDIA GPU here, but {index} cannot be reached: torch from pip's index "
        "(its Linux build carries CUDA, several GB); set VOICERT_TORCH_INDEX to a mirror"
    )


def main() -> int:
    env = dict(os.environ)
    index = env.get("VOICERT_TORCH_INDEX") or CPU_INDEX
    args, why = choose(platform.system(), platform.machine(), has_nvidia(env), index, reachable)
    print(why, file=sys.stderr)
    if args:
        print("\n".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
