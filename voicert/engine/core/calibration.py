"""The calibration set that GPTQ rounds against (engine/gpu/fp8.py, int4.py): its texts and chats
as token ids, and a forward of the model over them through an eager runner of its own. It runs
the model as the engine does, so it sits with the runner, above the quantized layers that use
its forward as a plain callable."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources

from voicert.core.chat import ChatMessage
from voicert.engine.core.prompt import build_prompt
from voicert.engine.core.runner import ModelRunner, Row
from voicert.engine.models.base import Model


def calibration_rows(tokenizer) -> list[list[int]]:
    """The calibration set as token ids: plain texts, and chats as the engine serves them (the
    user's turn under the tokenizer's chat template, then the reply's tokens)."""
    doc = json.loads(
        resources.files("voicert.engine").joinpath("data/fp8_calibration.json").read_text()
    )
    rows = [tokenizer(t)["input_ids"] for t in doc["texts"]]
    for user, reply in doc["chats"]:
        prompt = build_prompt(tokenizer, [ChatMessage("user", user)], 4096)
        rows.append(prompt + tokenizer(reply, add_special_tokens=False)["input_ids"])
    return rows


def calibration_forward(model: Model, tokenizer, block_size: int = 16) -> Callable[[], None]:
    """A function that runs ``model`` forward over :func:`calibration_rows`, one row at a time (no
    padding enters the moments), through an eager runner of its own whose KV pool lives only
    while it runs: the ``calibrate`` argument of :func:`~voicert.engine.gpu.fp8.quantize_fp8`
    (and ``quantize_int4``'s)."""
    rows = calibration_rows(tokenizer)  # once: the forward runs once per group of layers
    blocks = -(-max(map(len, rows)) // block_size)

    def forward() -> None:
        runner = ModelRunner(model, blocks + 1, block_size)  # block 0: the runner's scratch
        for ids in rows:
            runner.forward_rows([Row(ids, 0, list(range(1, blocks + 1)), len(ids))])

    return forward
