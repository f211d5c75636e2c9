"""``python -m voicert.engine.export_awq SRC OUT``: a checkpoint rounded to INT4 and written as
an AWQ checkpoint (engine/gpu/awq.py's format). It loads a model (models/registry.py), runs the
calibration forward (core/calibration.py) and quantizes (gpu/int4.py): a tool over the whole
engine, so it stands above all three."""

from __future__ import annotations

import argparse
from typing import cast

import torch

from voicert.engine.core.calibration import calibration_forward
from voicert.engine.gpu.awq import save_llama_awq
from voicert.engine.gpu.int4 import GROUPS, quantize_int4
from voicert.engine.models.registry import load_model


def main(argv: list[str] | None = None) -> int:
    """``python -m voicert.engine.export_awq SRC OUT``: an HF Llama-family checkpoint to INT4
    (GPTQ against the engine's calibration set, or nearest rounding), saved as an AWQ
    checkpoint that voicert and other engines (vLLM's AWQ Marlin kernels) load."""
    ap = argparse.ArgumentParser(
        prog="python -m voicert.engine.export_awq", description=main.__doc__
    )
    ap.add_argument("source", help="an HF checkpoint dir (config.json + *.safetensors)")
    ap.add_argument("out", help="the AWQ checkpoint dir to write")
    ap.add_argument("--group", type=int, default=128, choices=GROUPS)
    ap.add_argument("--rounding", default="gptq", choices=("gptq", "nearest"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = load_model(args.source, dtype, args.device)
    calibrate = None
    if args.rounding == "gptq":
        from transformers import AutoTokenizer

        calibrate = calibration_forward(model, AutoTokenizer.from_pretrained(args.source))
    module = cast(torch.nn.Module, model)  # every architecture is an nn.Module
    n = quantize_int4(module, calibrate, group=args.group, integer_zero=True)
    out = save_llama_awq(module, args.source, args.out)
    print(f"{n} INT4 layers (groups of {args.group}, {args.rounding}) -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
