"""A trained end-of-turn head: P(the user's turn is over) from the model's own hidden state.

A ``score_end`` request leaves the user's last message open (engine/prompt.py ``build_open``);
the model's final (normed) hidden state at its last token is what the LM head reads to predict
the end-of-message token. The zero-shot score is that token's probability; the head is a
logistic regression on the same hidden state, trained to tell a complete utterance from one cut
at a word (``scripts/train_turn_head.py``). It reads the forward pass the score already runs:
one dot product per scored row, no second request.

The head is only valid for the checkpoint it was trained on. The file carries that model's final
norm weight as a fingerprint, and :func:`load_turn_head` refuses a model whose norm differs.

voicert ships a head for the embedded SmolLM2-135M-Instruct (``llm.turn_head: auto``).
"""

from __future__ import annotations

from pathlib import Path

import torch

EMBEDDED_TURN_HEAD = (
    Path(__file__).parents[1] / "data" / "smollm2-135m-instruct-turn-head.safetensors"
)
# the fingerprint's tolerance: the stored norm (fp32) against the model's (bf16 on a GPU
# rounds to 3 significant digits; another checkpoint's norm differs by far more)
FINGERPRINT_RTOL = 1e-2


class TurnHead:
    """``prob(hidden)``: hidden [N, hidden] (any float dtype) -> N probabilities."""

    def __init__(self, weight: torch.Tensor, bias: float) -> None:
        self.weight = weight.float()  # [hidden], on the device the hidden states come from
        self.bias = bias

    def prob(self, hidden: torch.Tensor) -> list[float]:
        logit = hidden.float() @ self.weight + self.bias  # [N]
        return torch.sigmoid(logit).tolist()


def save_turn_head(
    path: str | Path,
    weight: torch.Tensor,
    bias: float,
    norm: torch.Tensor,
    metadata: dict[str, str],
) -> None:
    """Write a head (``weight`` [hidden], ``bias``) for the model whose final norm is ``norm``."""
    from safetensors.torch import save_file

    tensors = {
        "weight": weight.float().contiguous(),
        "bias": torch.tensor([float(bias)]),
        "norm": norm.float().contiguous(),
    }
    save_file(tensors, str(path), metadata=metadata)


def load_turn_head(path: str | Path, norm: torch.Tensor) -> TurnHead:
    """The head in ``path`` for the model whose final norm weight is ``norm`` [hidden], on
    ``norm``'s device (where the model's hidden states are). Raises ValueError when it was
    trained for another hidden size or another checkpoint."""
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not iterable
    missing = {"weight", "bias", "norm"} - set(state)
    if missing:
        raise ValueError(f"{path}: not an end-of-turn head (no {', '.join(sorted(missing))})")
    mine = norm.detach().float().cpu()
    if state["weight"].shape != mine.shape or state["norm"].shape != mine.shape:
        raise ValueError(
            f"{path}: the head was trained for hidden size {state['weight'].shape[0]}, "
            f"the model has {mine.shape[0]}"
        )
    if not torch.allclose(mine, state["norm"], rtol=FINGERPRINT_RTOL, atol=FINGERPRINT_RTOL):
        raise ValueError(f"{path}: the head was trained for another checkpoint (its norm differs)")
    return TurnHead(state["weight"].to(norm.device), float(state["bias"][0]))
