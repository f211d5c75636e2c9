"""The contract floor holds: every engine and ASR backend has the whole interface it is typed
as, so no caller has to probe one with getattr / hasattr."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from voicert.core.llm import Engine
from voicert.core.speech import Asr

ROOT = Path(__file__).resolve().parents[2] / "voicert"


def _members(protocol: type) -> set[str]:
    names = {n for n in vars(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


def _engines() -> list[type]:
    from voicert.engine.clients.host import SharedEngineClient
    from voicert.engine.clients.llm_engine import LLMEngine
    from voicert.engine.clients.openai_compat import OpenAICompatEngine
    from voicert.engine.clients.remote import EngineLink, EngineProcess
    from voicert.engine.clients.replicas import ReplicaEngine
    from voicert.engine.clients.simple import SimpleEngine
    from voicert.engine.clients.supervisor import SupervisedEngine

    return [
        LLMEngine,
        EngineLink,
        EngineProcess,
        SharedEngineClient,
        SimpleEngine,
        OpenAICompatEngine,
        SupervisedEngine,
        ReplicaEngine,
    ]


def _has(cls: type, name: str) -> bool:
    """A class attribute, or one its __init__ assigns (``self.name = ...``)."""
    if any(name in vars(k) or name in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    source = inspect.getsource(cls.__init__) if "__init__" in vars(cls) else ""
    return f"self.{name} =" in source or f"self.{name}:" in source


@pytest.mark.parametrize("cls", _engines(), ids=lambda c: c.__name__)
def test_every_engine_has_the_whole_engine_interface(cls):
    missing = sorted(n for n in _members(Engine) if not _has(cls, n))
    assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("path", ["voicert.speech.asr:WhisperAsr", "voicert.speech.host:SharedAsr"])
def test_every_asr_backend_has_the_whole_asr_interface(path):
    import importlib

    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    missing = sorted(n for n in _members(Asr) if not _has(cls, n))
    assert not missing, f"{name} lacks {missing}"


def test_no_part_probes_an_engine_or_asr_with_getattr():
    """getattr / hasattr on something named engine, replica or asr, outside the engine's own
    package (whose loaders read third-party configs that way)."""
    found = []
    for path in ROOT.rglob("*.py"):
        if path.is_relative_to(ROOT / "engine"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
            ):
                target = ast.unparse(node.args[0]).lower()
                if any(w in target for w in ("engine", "replica", "asr")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)
