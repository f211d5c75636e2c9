"""Draft heads (Medusa-style): speculative drafts from the target's own last hidden state.

Head i maps the target's final (normed) hidden state at position p, whose LM-head output is the
token at p + 1, to a guess of the token at p + 2 + i, through one residual SiLU layer and the
target's own frozen LM head. The heads run inside the target's forward (one extra small matmul per
head on the sampled positions), so drafting costs no extra model step; the target verifies the
drafts in its next step like any others (``speculative.accept_greedy``), so the output is the
target's greedy output token for token whatever the heads guess.

voicert ships heads trained for the embedded SmolLM2-135M-Instruct on its own greedy replies
(self-distillation; ``scripts/train_draft_heads.py``): ``llm.draft_heads: embedded``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

EMBEDDED_HEADS = Path(__file__).parents[1] / "data" / "smollm2-135m-instruct-heads.safetensors"


class DraftHeads(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))

    @property
    def num_heads(self) -> int:
        return len(self.proj)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> [num_heads, N, hidden]: each head's input to the LM head."""
        return torch.stack([hidden + F.silu(p(hidden)) for p in self.proj])


def load_heads(
    path: str | Path,
    hidden_size: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: str | torch.device,
) -> DraftHeads:
    """Heads from a safetensors file (``proj.{i}.weight`` / ``.bias``, metadata ``vocab_size``).
    Raises ValueError when they were made for another hidden size or vocabulary."""
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not iterable
    n = len([k for k in state if k.endswith(".weight")])
    if n == 0 or state["proj.0.weight"].shape != (hidden_size, hidden_size):
        raise ValueError(f"{path}: draft heads do not fit a model of hidden size {hidden_size}")
    if int(meta.get("vocab_size", vocab_size)) != vocab_size:
        raise ValueError(
            f"{path}: draft heads were trained for a vocabulary of "
            f"{meta['vocab_size']}, the model has {vocab_size}"
        )
    heads = DraftHeads(hidden_size, n)
    heads.load_state_dict(state)
    return heads.to(device=device, dtype=dtype).eval()
