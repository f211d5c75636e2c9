"""Training text shared by the training scripts (run as ``python scripts/NAME.py``, so this
folder is on the path): never a dependency of voicert."""

from __future__ import annotations

import re
import sys
from importlib import resources


def corpus_lines(min_words: int) -> list[str]:
    """chatterbot-corpus's English lines of ``min_words``-30 words, without markup, sorted."""
    try:
        import yaml

        root = resources.files("chatterbot_corpus") / "data" / "english"
    except ModuleNotFoundError:
        sys.exit("training text: pip install --no-deps chatterbot-corpus (BSD)")
    lines = set()
    for f in sorted(root.iterdir(), key=lambda p: p.name):
        if not f.name.endswith(".yml"):
            continue
        for conv in yaml.safe_load(f.read_text()).get("conversations", []):
            for line in conv:
                if isinstance(line, str):
                    line = " ".join(line.split())
                    if min_words <= len(line.split()) <= 30 and not re.search(
                        r"[<>{}\[\]=_`]", line
                    ):
                        lines.add(line)
    return sorted(lines)
