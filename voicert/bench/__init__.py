"""Benchmarks: each a module run with ``python -m voicert.bench.NAME``."""

from pathlib import Path

# the test data the benches read (clips, the eval and turn sets): in a source checkout only
DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
