"""Write an HF checkpoint dir of a Llama-3.2-1B- (or 3.1-8B-) shaped model with RANDOM weights,
for timing only.

The vocabulary is cut to SmolLM2's 49152 entries so the embedded SmolLM2 tokenizer and chat template
can drive it through the real server (the 1B shape's own tokenizer is not available offline); every
other shape is Llama-3.2-1B's. Label results from it "Llama-3.2-1B shape, random weights, vocab 49152".

Usage (after `source scripts/gpu/env.sh`, which puts the repo on PYTHONPATH):
    python3 scripts/gpu/random_llama.py TOKENIZER_DIR OUT_DIR [1b|8b]
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from voicert.bench.shapes import SHAPES as BENCH_SHAPES

SHAPES = {"1b": ("Llama-3.2-1B", "llama-1b-random"), "8b": ("Llama-3.1-8B", "llama-8b-random")}


def dims(shape: str) -> dict:
    """The bench's random shape (bench/shapes.py) without its vocabulary (SmolLM2's here), with
    positions up to 8192."""
    d = {k: v for k, v in BENCH_SHAPES[SHAPES[shape][1]].items() if k != "vocab_size"}
    return {**d, "max_position_embeddings": 8192}


def main(tokenizer_dir: str, out_dir: str, shape: str = "1b") -> None:
    label = SHAPES[shape][0]
    src, out = Path(tokenizer_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok_cfg = json.loads((src / "config.json").read_text())
    cfg = LlamaConfig(
        vocab_size=49152,
        bos_token_id=tok_cfg.get("bos_token_id"),
        eos_token_id=tok_cfg.get("eos_token_id"),
        torch_dtype="bfloat16",
        **dims(shape),
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for name in src.iterdir():
        if name.name.startswith(
            ("tokenizer", "special_tokens", "chat_template", "generation_config")
        ):
            shutil.copy(name, out / name.name)
    n = sum(p.numel() for p in model.parameters())
    print(f"random {label} shape ({n / 1e9:.2f} B params, vocab 49152) -> {out}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
