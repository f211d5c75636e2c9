"""How long GPTQ rounding of FP8 weights (llm.rounding: gptq) takes at engine start on a GPU,
for the Llama-3.2-1B and 3.1-8B shapes with RANDOM WEIGHTS (the time depends on the shapes, not
the values), against nearest rounding; and that the rounded weights lower the layers' output error
on the calibration inputs there too.

Calibration rows are random token ids of the calibration set's size (68 rows, ~6300 tokens: what
engine/core/calibration.calibration_rows gives with the embedded tokenizer).

Usage (GPU machine, repo root): python3 scripts/gpu/gptq_time.py [1b,8b] [block,...]
"""

import sys
import time

import torch

from voicert.bench.shapes import shape_config
from voicert.engine.core.runner import ModelRunner, Row
from voicert.engine.gpu import fp8
from voicert.engine.models.llama import LlamaConfig, random_llama


def main(shapes: str = "1b,8b", blocks: str = "32,128") -> None:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in [20] * 20 + [134] * 48]
    for shape in shapes.split(","):
        cfg = LlamaConfig.from_hf(shape_config(f"llama-{shape}-random"))
        model = random_llama(cfg, torch.bfloat16, "cuda")
        runner = ModelRunner(model, 10, 16)

        def forward(runner=runner):  # bound now: the loop deletes it after timing
            for ids in rows:
                runner.forward_rows([Row(ids, 0, list(range(1, 10)), len(ids))])

        layer = model.layers[len(model.layers) // 2]
        t0 = time.perf_counter()
        moments = fp8.input_moments(
            [m for m in layer.modules() if isinstance(m, torch.nn.Linear)], forward
        )
        torch.cuda.synchronize()
        t_mom = time.perf_counter() - t0
        graphs = {}
        for name in ("attn.qkv", "mlp.down"):
            lin = layer.get_submodule(name)
            h = moments[lin]
            w = lin.weight.detach().float()
            for block in map(int, blocks.split(",")):  # (first call: its graphs' capture)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                q, s = fp8.gptq_weight(lin.weight, h, block=block, graphs=graphs)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                qn, sn = fp8.quantize_weight(lin.weight)

                def err(qq, ss):  # relative output error on the calibration inputs: tr(E H E^T)
                    e = qq.float() * ss[:, None] - w
                    return ((e @ h * e).sum() / (w @ h * w).sum()).sqrt().item()

                print(
                    f"{shape} {name} {tuple(w.shape)} block {block}: GPTQ {dt * 1e3:.0f} ms; "
                    f"output error GPTQ {err(q, s):.4f} vs nearest {err(qn, sn):.4f}",
                    flush=True,
                )
        del moments, graphs
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        n = fp8.quantize_fp8(model, forward)
        torch.cuda.synchronize()
        print(
            f"{shape}: one layer's moments {t_mom:.1f} s; whole quantize_fp8 with GPTQ ({n} "
            f"Linears): {time.perf_counter() - t0:.1f} s; memory while it ran, above the bf16 model "
            f"before it: {(torch.cuda.max_memory_allocated() - base) / 2**30:.1f} GiB at most",
            flush=True,
        )
        del model, runner
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main(*sys.argv[1:])
