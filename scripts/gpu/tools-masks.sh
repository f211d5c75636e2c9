#!/usr/bin/env bash
# The per-step cost of guided decoding on the GPU (python -m voicert.bench.tools masks).
# Carry: .carry/toolswhl (msgspec and llguidance cp312 wheels) and .carry/tok (the embedded
# model's tokenizer files). Writes its tables under $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .carry/toolswhl/*.whl
export PYTHONPATH=$PWD:/root/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
date -u | tee -a $OUT/gpu.txt
common=(--device cuda --dtype bfloat16 --cuda-graphs --fused-kernels --tokenizer .carry/tok --new 128)
for model in smollm2-random llama-1b-random; do
  timeout 240 python3 -m voicert.bench.tools masks --model $model --batches 1,16,64 "${common[@]}" \
    --json > $OUT/masks-$model.json 2> $OUT/masks-$model.log
  python3 -c "import json,sys; from voicert.bench.tools import render_masks; print(render_masks(json.load(open(sys.argv[1]))))" $OUT/masks-$model.json | tee $OUT/masks-$model.md
done
date -u
