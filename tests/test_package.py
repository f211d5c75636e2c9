"""Importing voicert: CTranslate2 keeps its own OpenMP runtime (see voicert/__init__.py)."""

import os
import re
import subprocess
import sys


def _gomp_of_ctranslate2(code: str) -> str:
    """The library CTranslate2's GOMP_parallel binds to when ``code`` runs (bound at load)."""
    env = {**os.environ, "LD_DEBUG": "bindings", "LD_BIND_NOW": "1"}
    err = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stderr
    found = re.search(
        r"binding file \S*libctranslate2\S* \[0\] to (\S+) \[0\]: normal symbol `GOMP_parallel'",
        err,
    )
    assert found, "no binding of CTranslate2's GOMP_parallel was logged"
    return found.group(1)


def test_ctranslate2_keeps_its_own_openmp_runtime_when_torch_comes_after_voicert():
    assert "ctranslate2.libs/libgomp" in _gomp_of_ctranslate2("import voicert, torch")
    # the case the import order prevents: one runtime for both (the control: the check can fail)
    assert "torch/lib/libgomp" in _gomp_of_ctranslate2("import torch, voicert")
