"""A built wheel (not the source tree) carries the browser client, the dashboard and the default
config, and serves them once installed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_web_and_the_default_config_and_serves_them(tmp_path):
    pytest.importorskip("setuptools")  # the build backend, from the venv (no network)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(ROOT),
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("voicert-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (
        "voicert/web/index.html",
        "voicert/web/app.js",
        "voicert/web/dashboard.js",
        "voicert/web/dashboard.html",
        "voicert/web/capture-worklet.js",
        "voicert/configs/default.yaml",
        "loadgen/__main__.py",  # python -m loadgen works from the wheel
        "loadgen/report.py",
    ):
        assert name in names
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    probe = (
        "import voicert, voicert.config as c, voicert.server.dashboard as d;"
        f"assert voicert.__file__.startswith({str(target)!r}), voicert.__file__;"
        "assert c.DEFAULT_CONFIG_PATH.is_file();"
        "assert b'<html' in d.static_file('/')[0].lower();"
        "assert b'<canvas' in d.static_file('/dashboard')[0];"
        "assert d.static_file('/app.css')[0] and d.static_file('/dashboard.css')[0];"
        "import loadgen;"
        f"assert loadgen.__file__.startswith({str(target)!r}), loadgen.__file__"
    )
    subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )


def test_the_browser_sources_live_in_a_top_level_web_folder():
    """The project card's layout (pyproject.toml, README.md, voicert/, web/, tests/, configs/,
    loadgen/): web/ holds the files; the package reaches them through a link, so the wheel
    carries them as voicert/web/."""
    assert (ROOT / "web" / "index.html").is_file() and not (ROOT / "web").is_symlink()
    assert (ROOT / "voicert" / "web").resolve() == (ROOT / "web").resolve()
