"""A GGUF file's 4-bit layer tensors as :class:`~voicert.engine.gpu.int4.Int4Linear` layers, with
no rounding of our own (``llm.int4`` on a ``.gguf`` model: ``engine/build.py``).

llama.cpp's 4-bit formats are int4.py's grid, ``code * scale + low`` per 32 columns of a row:

    Q4_0  blocks of 32: d (float16), 16 bytes of codes      w = d * (code - 8)
    Q4_1  blocks of 32: d, m (float16), 16 bytes of codes   w = d * code + m
    Q4_K  blocks of 256: d, dmin (float16), twelve bytes of eight 6-bit (sc, m) pairs, 128
          bytes of codes; sub-block j of 32 columns         w = d * sc_j * code - dmin * m_j

In a block of 32 (Q4_0, Q4_1) byte i holds column i in its low nibble and column i + 16 in its
high one. In a Q4_K block, byte i of each 32-byte chunk c holds column i of sub-block 2c (low
nibble) and of sub-block 2c + 1 (high). :func:`decode` gives each column's code with each
group's scale and low in float32, exactly as gguf-py's dequantization computes them; an
:class:`Int4Linear` stores the scale and low in float16, which holds Q4_0's and Q4_1's exactly
and Q4_K's ``d * sc`` and ``dmin * m`` to within 2^-12 of them.

A fused layer of ours (q/k/v, gate/up) imports whole when each of its GGUF parts is 4-bit. A
Q4_K_M file keeps half its layers' ``attn_v`` and ``ffn_down`` in Q6_K: a fused layer with such
a part has it rounded to INT4 inside the layer, or is left whole (:func:`import_int4`'s
``round_parts``), and the layers of more bits are left to the caller (:func:`quantize_from_gguf`
puts them in FP8 where it runs). Each import is checked against the weights the model already
holds (the same file dequantized by transformers): a layout this module misreads is refused,
not served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from voicert.engine.gpu.fp8 import quantize_fp8
from voicert.engine.gpu.int4 import Int4Linear, nearest, pack, quantize_int4

GROUP = 32  # the columns of one scale and low, in every 4-bit GGUF type
FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")
# our fused Linears, by their path in a layer, and the GGUF tensors they hold, in row order
PARTS = {
    "attn.qkv": ("attn_q", "attn_k", "attn_v"),
    "attn.o": ("attn_output",),
    "mlp.gate_up": ("ffn_gate", "ffn_up"),
    "mlp.down": ("ffn_down",),
}
PERMUTED_QK = ("llama",)  # architectures whose converter permuted q/k rows for llama.cpp's RoPE
# (transformers' GGUF loader undoes it for these: its LlamaTensorProcessor)


def decode(kind: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 4-bit tensor's raw rows uint8 [N, bytes] of ``kind`` (one of :data:`FOUR_BIT`) ->
    (codes uint8 [N, K], scale float32 [N, K / 32], low float32 [N, K / 32]): column k is
    ``codes[:, k] * scale[:, k // 32] + low[:, k // 32]``, the value gguf-py dequantizes."""
    n = blocks.shape[0]
    if kind == "Q4_K":
        return _decode_q4_k(blocks.reshape(n, -1, 144))
    size = {"Q4_0": 18, "Q4_1": 20}.get(kind)
    if size is None:
        raise ValueError(f"gguf: {kind} is not a 4-bit type ({', '.join(FOUR_BIT)})")
    b = blocks.reshape(n, -1, size)  # [N, blocks, bytes]
    d = _f16(b[..., 0:2])  # [N, blocks]
    qs = b[..., size - 16 :]  # [N, blocks, 16]
    codes = np.concatenate((qs & 15, qs >> 4), axis=-1).reshape(n, -1)  # [N, K]
    low = _f16(b[..., 2:4]) if kind == "Q4_1" else -8.0 * d
    return codes, d, low.astype(np.float32)


def _decode_q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K blocks [N, blocks, 144] -> as :func:`decode`."""
    from gguf.quants import Q4_K

    n, nb = b.shape[:2]
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]  # [N, blocks, 1]
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[..., 4:16]).reshape(-1, 12))  # [., 8]
    scale = d * sc.reshape(n, nb, 8).astype(np.float32)  # [N, blocks, 8]
    low = -(dmin * m.reshape(n, nb, 8).astype(np.float32))
    qs = b[..., 16:].reshape(n, nb, 4, 1, 32)  # [N, blocks, chunk, 1, 32]
    codes = np.concatenate((qs & 15, qs >> 4), axis=3)  # [N, blocks, chunk, 2, 32]
    return codes.reshape(n, -1), scale.reshape(n, -1), low.reshape(n, -1)


def _f16(two: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 (a little-endian float16) -> [...] float32."""
    return np.ascontiguousarray(two).view(np.float16)[..., 0].astype(np.float32)


@dataclass
class Tensor:
    """One GGUF tensor: its type's name and its raw rows uint8 [N, bytes] (4-bit types) or
    values."""

    kind: str
    data: np.ndarray


class GgufFile:
    """A GGUF file's layer tensors by name (memory-mapped) and its architecture."""

    def __init__(self, path: str | Path) -> None:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        self.path = Path(path)

        def value(key: str):  # a field's first value (an array of parts), or None
            field = reader.fields.get(key)
            return None if field is None else field.parts[field.data[0]]

        self.arch = bytes(value("general.architecture")).decode()
        self.tensors = {t.name: Tensor(t.tensor_type.name, t.data) for t in reader.tensors}
        heads = value(f"{self.arch}.attention.head_count")
        self.heads = int(heads[0]) if heads is not None else 0
        kv = value(f"{self.arch}.attention.head_count_kv")
        self.kv_heads = int(kv[0]) if kv is not None else self.heads

    def int4_rows(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Tensor ``name``'s (codes, scale, low) in the model's row order (:func:`decode`), or
        None when it is not 4-bit."""
        t = self.tensors[name]
        if t.kind not in FOUR_BIT:
            return None
        rows = decode(t.kind, t.data)
        if self.arch in PERMUTED_QK and (".attn_q." in name or ".attn_k." in name):
            heads = self.heads if ".attn_q." in name else self.kv_heads
            rows = tuple(_unpermute(a, heads) for a in rows)  # type: ignore[assignment]
        return rows


def _unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Rows [N, ...] of a q or k projection from llama.cpp's order back to the checkpoint's:
    within each head, the rows were interleaved as pairs (i, i + half) -> (2i, 2i + 1)."""
    n = rows.shape[0]
    half = n // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _linears(model: nn.Module) -> Iterator[tuple[int, str, nn.Module, str, nn.Module]]:
    """(layer index, our path, parent, attribute, module) for each of :data:`PARTS` in each of
    ``model.layers``."""
    for i, layer in enumerate(model.layers):
        for path in PARTS:
            parent_path, _, attr = path.rpartition(".")
            try:
                parent = layer.get_submodule(parent_path)
                yield i, path, parent, attr, getattr(parent, attr)
            except AttributeError:
                raise ValueError(
                    f"the model's layers have no {path}: {type(model).__name__} does not "
                    "import a GGUF's 4-bit layers"
                ) from None


@dataclass
class Imported:
    """What :func:`import_int4` did: the layers now INT4 (``count``), those of them with a part
    rounded (``rounded``), and those left as they were (``left``), each as "layers.3.mlp.down
    (Q6_K)"."""

    count: int
    rounded: list[str]
    left: list[str]


def import_int4(model: nn.Module, source: GgufFile, round_parts: bool = True) -> Imported:
    """Replace, in place, each Linear of ``model.layers`` with a 4-bit GGUF part
    (:data:`PARTS`) by an :class:`Int4Linear` in groups of 32, its bias kept: the 4-bit parts'
    rows hold the file's own codes; ``round_parts``: another part of the same fused layer (a
    Q6_K ``attn_v`` beside Q4_K q and k) is rounded to the nearest code of int4.py's grid from
    the weights the model holds (else such a layer is left whole). ValueError when the model's
    shapes are not the file's, or a layer's imported rows are not the weights it held (within
    the float16 of the scales and lows, and the model's dtype)."""
    done = Imported(0, [], [])
    for i, path, parent, attr, lin in _linears(model):
        names = [f"blk.{i}.{part}.weight" for part in PARTS[path]]
        missing = [n for n in names if n not in source.tensors]
        if missing:
            raise ValueError(f"{source.path.name}: no tensor {missing[0]} for layers.{i}.{path}")
        parts = [source.int4_rows(n) for n in names]
        where = f"layers.{i}.{path} ({'/'.join(source.tensors[n].kind for n in names)})"
        four = [p is not None for p in parts]
        if not isinstance(lin, nn.Linear) or not any(four) or not (all(four) or round_parts):
            done.left.append(where)
            continue
        rows = [len(p[0]) if p is not None else 0 for p in parts]
        rows = _fill(rows, lin.out_features, f"{source.path.name}: {'+'.join(names)}", where)
        at = np.cumsum([0, *rows])
        parts = [
            p if p is not None else _rounded(lin.weight[at[j] : at[j + 1]])
            for j, p in enumerate(parts)
        ]
        codes, scale, low = (np.concatenate(a) for a in zip(*parts))  # type: ignore[misc]
        if codes.shape != tuple(lin.weight.shape):
            raise ValueError(
                f"{source.path.name}: {'+'.join(names)} are {codes.shape}, layers.{i}.{path} "
                f"is {tuple(lin.weight.shape)}"
            )
        bias = lin.bias.detach() if lin.bias is not None else None
        q = Int4Linear(
            pack(torch.from_numpy(codes), GROUP).to(lin.weight.device),
            torch.from_numpy(scale).half().to(lin.weight.device),
            torch.from_numpy(low).half().to(lin.weight.device),
            bias,
        )
        exact = torch.cat([torch.full((r,), f) for r, f in zip(rows, four)])  # [N]: file's rows
        _check(q, lin.weight.detach(), exact, f"layers.{i}.{path}", source.path.name)
        setattr(parent, attr, q)
        done.count += 1
        if not all(four):
            done.rounded.append(where)
    return done


def quantize_from_gguf(
    model: nn.Module,
    source: GgufFile,
    calibrate: Callable[[], None] | None,
    fp8_rest: bool,
    group: int = 128,
    head: bool = False,
) -> list[str]:
    """``model``'s layers as INT4 from ``source``, the file it was converted from, in place:
    the file's 4-bit layers as it holds them (:func:`import_int4`); ``fp8_rest``: the layers of
    more bits (and fused layers with such a part) to FP8 (their Q6_K values are 6-bit: FP8
    keeps 98 % top-1 where INT4 keeps 95 %, docs/benchmarks.md 63), else their parts rounded to
    INT4 and the rest to INT4 in groups of ``group``. ``calibrate`` (GPTQ) and ``head``: as
    :func:`~voicert.engine.gpu.int4.quantize_int4`'s. A file with no 4-bit layers is INT4
    throughout. What was done, a phrase a step."""
    done = import_int4(model, source, round_parts=not fp8_rest)
    said = []
    if done.count:
        rounded = f", {len(done.rounded)} of them with a part rounded" * bool(done.rounded)
        said.append(
            f"{done.count} hold {source.path.name}'s own 4-bit codes (groups of 32){rounded}"
        )
        if fp8_rest:
            said.append(f"{quantize_fp8(model, calibrate)} the rest FP8")
    n = quantize_int4(model, calibrate, group=group, head=head)
    if n or not said:
        said.append(f"{n} INT4 (groups of {group})")
    return said


def _fill(rows: list[int], total: int, tensors: str, where: str) -> list[int]:
    """The rows of each part of a fused layer of ``total`` rows: the 4-bit parts' as read, the
    one other part's (0 in ``rows``) the rest. ValueError when they cannot add up."""
    unknown = [j for j, r in enumerate(rows) if r == 0]
    rest = total - sum(rows)
    if len(unknown) == 1 and rest > 0:
        rows[unknown[0]] = rest
    elif unknown or rest:
        raise ValueError(f"{tensors} have {rows} rows (0: not 4-bit), {where} has {total}")
    return rows


def _rounded(w: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of held weights [R, K] -> as :func:`decode`, rounded to the nearest code of
    int4.py's grid in groups of 32."""
    codes, scale, low = nearest(w, GROUP)
    return codes.cpu().numpy(), scale.cpu().numpy(), low.cpu().numpy()


def _check(q: Int4Linear, held: torch.Tensor, exact: torch.Tensor, where: str, file: str) -> None:
    """ValueError unless ``q``'s rows where ``exact`` [N] bool are ``held``'s [N, K] (the same
    file dequantized, in the model's dtype): within a hundredth of a step, the float16 of the
    low and held's rounding. (The other rows were rounded from ``held``.)"""
    exact = exact.to(held.device)
    q, held = Int4Linear(q.weight[exact], q.scale[exact], q.low[exact], None), held[exact]
    ours = q.dequantized(torch.float32)
    step = q.scale.float().abs().repeat_interleave(q.group, dim=1)  # (Q4_0's d may be < 0)
    low = q.low.float().abs().repeat_interleave(q.group, dim=1)
    eps = torch.finfo(held.dtype).eps
    bound = step / 100 + low * 2**-11 + held.float().abs() * eps
    off = ((ours - held.float()).abs() - bound).max().item()
    if not off <= 0:  # (NaN too: a damaged block's scale)
        raise ValueError(
            f"{file}: the 4-bit codes read for {where} are not the weights the model holds "
            f"(off by {off:.3g} past the rounding allowed): this GGUF layout is not supported"
        )
