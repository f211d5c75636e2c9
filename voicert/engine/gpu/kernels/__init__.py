"""Fused GPU kernels (Triton) for decode and prefill steps: fewer, larger launches per layer.

A small model's decode step is launch-bound: SmolLM2-135M runs ~20 kernels in each of its 30
layers, most of them tiny (RMSNorm, the four ops of RoPE, two KV writes, two KV gathers, layout
copies, SiLU, the multiply, residual adds). These kernels fold them into five or six launches
per layer (two norms, RoPE + KV write, attention and at small batch its combine, SiLU * up)
beside the layer's four GEMMs:

- :func:`add_rms_norm`: residual add + RMSNorm (one pass; the sum is kept as the new residual);
- :func:`rope_kv_write`: RoPE on q and k in place (cos and sin read from the model's tables by
  position), and k/v written into their KV-pool slots;
- :func:`paged_attention`: attention straight from the paged pool through the block table (no
  gathered copy), over tiles of query tokens (a decode step's few, a prefill row's many), split
  over the key axis when the programs are few (flash-decoding); the last split program of each
  tile to finish combines the splits;
- :func:`silu_mul`: SiLU(gate) * up;
- :func:`argmax_rows`: the greedy token of each row of logits, many programs per row, the last
  one to finish reducing their partial results;
- :func:`fp8_linear`: a Linear over FP8 weights (engine/gpu/fp8.py), the weights widened in registers,
  K split over programs when the output has few tiles (the last split to finish adds them); many
  bf16 rows go to the FP8 tensor cores instead (:func:`fp8_rows`, then ``torch._scaled_mm``).

On Hopper and newer GPUs every kernel here can be launched with programmatic dependent launch
(``pdl=True``; the engine's ``llm.pdl``): it may then start while the kernel before it on the
stream still runs. Each program does its index arithmetic (and the FP8 kernel reads its first
weight tile: weights are never written during a step), then waits for the kernel before to have
finished (``griddepcontrol.wait``) before touching anything another kernel writes or reads, then
lets the next kernel start. cuBLAS and torch kernels between them launch as usual and wait for a
full finish. The FP8 kernel also runs bf16/fp16 Linears unscaled (``scale`` None) for small
steps, so that a decode step's GEMMs chain with the rest (``llm.decode_linear``).

"The last program to finish" is a counter per output row, bumped with an acquire-release atomic
after the program's partial results are stored; the program that reads ``count - 1`` reads the
others' partials (from L2, past its own L1) and sets the counter back to zero for the next launch.
Counters are owned by the caller (the model: one engine thread runs it) and must start at zero.

Numerics follow the torch path's order (the residual sum is rounded to the model dtype before it is
normalised; SiLU is rounded before the multiply) but reductions run in a different order, so fp32
results agree to rounding, not bit for bit. Matmuls in fp32 run in IEEE fp32 (never TF32).

Everything here is launched from :class:`voicert.engine.models.llama.LlamaModel` when the model's
``use_kernels`` is set (the engine sets it on CUDA). With ``TRITON_INTERPRET=1`` set before this
package is imported, the same kernels run on CPU tensors (tests do this; it is slow).

The modules, each over the ones after it: norms.py (RMSNorm, SiLU * up), attention.py (RoPE, the
KV write, paged attention), sampling.py (the greedy pick, speculation's bookkeeping),
fp8_matmul.py (FP8 and few-row bf16 Linears), matvec.py (one row on the CUDA cores),
int4_matmul.py (INT4 Linears and a one-row x's planes), common.py (PDL, split-K). The functions
a caller launches are named here; a kernel's settings (its UPPER_CASE constants) are read and
set on its own module, e.g. ``kernels.fp8_matmul.FP8_MM_ROWS``, so that one value is in force.
"""

from voicert.engine.gpu.kernels.attention import paged_attention, rope_kv_write
from voicert.engine.gpu.kernels.common import counters, pdl_supported
from voicert.engine.gpu.kernels.fp8_matmul import (
    fp8_blocks,
    fp8_linear,
    fp8_mm,
    fp8_mm_blocks,
    fp8_rows,
    fp8_scaled_mm,
    linear_tiles,
)
from voicert.engine.gpu.kernels.int4_matmul import (
    Int4Path,
    int4_a8_planes,
    int4_blocks,
    int4_dequantize,
    int4_gemv,
    int4_gemv_a8,
    int4_gemv_fits,
    int4_gemv_tile,
    int4_linear,
    int4_path,
    int4_planes,
    int4_split,
)
from voicert.engine.gpu.kernels.matvec import gemv
from voicert.engine.gpu.kernels.norms import add_rms_norm, silu_mul
from voicert.engine.gpu.kernels.sampling import accept_counts, argmax_rows, feed_step

__all__ = [
    "Int4Path",
    "accept_counts",
    "add_rms_norm",
    "argmax_rows",
    "counters",
    "feed_step",
    "fp8_blocks",
    "fp8_linear",
    "fp8_mm",
    "fp8_mm_blocks",
    "fp8_rows",
    "fp8_scaled_mm",
    "gemv",
    "int4_a8_planes",
    "int4_blocks",
    "int4_dequantize",
    "int4_gemv",
    "int4_gemv_a8",
    "int4_gemv_fits",
    "int4_gemv_tile",
    "int4_linear",
    "int4_path",
    "int4_planes",
    "int4_split",
    "linear_tiles",
    "paged_attention",
    "pdl_supported",
    "rope_kv_write",
    "silu_mul",
]
