#!/usr/bin/env bash
# Engine replicas on a 2-GPU host (python -m voicert.bench.replicas): one GPU at S sessions, then
# two GPUs at 2S (with and without conversation affinity), on a random-weight Llama shape.
# Carry: .carry/toolswhl (msgspec + llguidance cp312) and .carry/tok (the embedded tokenizer).
# Usage: bash scripts/gpu/replicas.sh [1b|8b] [sessions per GPU, e.g. 64,128,256]
set -uo pipefail
shape=${1:-8b}
sessions=${2:-64,128,256}
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .carry/toolswhl/*.whl
export PYTHONPATH=$PWD:/root/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
date -u | tee -a $OUT/gpu.txt
t0=$(date +%s)
python3 scripts/gpu/random_llama.py .carry/tok /root/llama-$shape $shape 2>&1 | tail -1 | tee $OUT/model.txt
echo "model written in $(( $(date +%s) - t0 )) s" | tee -a $OUT/model.txt
label="Llama-3.x-$shape shape, RANDOM WEIGHTS (timing only), vocab 49152, bf16"
python3 -m voicert.bench.replicas --model /root/llama-$shape --label "$label" --gpus 1,2 \
  --sessions "$sessions" --think 3 --new 48 --duration 20 --warmup 6 --compare-affinity \
  2> >(tee $OUT/replicas.log >&2) | tee $OUT/replicas.md
date -u
