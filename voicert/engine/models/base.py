"""What every architecture gives the engine: the :class:`Model` interface that the scheduler,
the model runner, the prefix cache and the speculative paths are written against, so a new
architecture is one file in this package and one line in ``registry.py``.

It lives at the bottom of ``engine/models`` and not on the contract floor (``voicert/core``):
its words are torch tensors and the engine's attention inputs, which only the engine sees, and
the floor imports nothing but the standard library.
"""

from __future__ import annotations

from typing import Protocol

import torch

from voicert.engine.models.layers import AttnInputs


class ModelShape(Protocol):
    """The sizes the engine plans with (an architecture's config has these and more)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def max_position(self) -> int: ...


class Model(Protocol):
    """A decoder over the paged KV pool.

    ``forward``: input_ids [B, Q] int64, ``inp`` (positions [B, Q], slots [B*Q], block tables
    [B, MB]), k_pool / v_pool [layers, NB, BS, KVH, D] (written at ``inp.slots``) -> hidden
    [B, Q, hidden] after the final norm. ``greedy``: hidden [..., hidden] -> int64 [...] (the
    argmax of ``logits``, ties to the lowest id). ``logits``: hidden -> float32 [..., vocab].

    The kernel settings are chosen once by the engine from ``llm`` (``EngineCore``) before the
    first step, and read by the layers: ``use_kernels`` (the Triton path; an architecture with
    none keeps it False), ``prefill_attention`` (paged | flash | sdpa), ``pdl``,
    ``triton_linear_rows`` and ``linear_tiles`` (see ``engine/gpu/kernels/fp8_matmul.py``)."""

    cfg: ModelShape
    norm: torch.nn.Module  # the final norm; its weight fingerprints the checkpoint (turn_head.py)
    use_kernels: bool
    prefill_attention: str
    pdl: bool
    triton_linear_rows: int
    linear_tiles: dict[tuple[int, int], tuple]

    def forward(
        self, input_ids: torch.Tensor, inp: AttnInputs, k_pool: torch.Tensor, v_pool: torch.Tensor
    ) -> torch.Tensor: ...

    def greedy(
        self,
        hidden: torch.Tensor,
        out: torch.Tensor | None = None,
        head_out: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...
