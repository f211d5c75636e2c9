#!/usr/bin/env bash
# The LLM stage over HTTP vs the built-in engine, side by side on a 2-GPU host: vLLM 0.26.0's OpenAI
# server on GPU 1 (dummy weights), voicert's engine process on GPU 0 (random weights), the same
# random-weight Llama shape and the same simulated conversations (python -m voicert.bench.replicas).
# Before it: the parts of .carry/vllm (scripts/gpu/fetch-vllm.sh) appended to /root/vb.tar, one
# call each, all but the last; this call carries the last part, SHA256, .carry/toolswhl, .carry/tok.
# Usage: bash scripts/gpu/vllm-remote.sh LAST_PART [1b|8b] [sessions]
set -uo pipefail
last=$1; shape=${2:-8b}; sessions=${3:-64}
bash scripts/gpu/vllm-install.sh "$last" || exit $?
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .carry/toolswhl/*.whl
PYTHONPATH=/root/vsite python3 -c "import vllm.entrypoints.openai.api_server" 2>&1 | tail -3 | tee $OUT/vllm-import.txt
grep -q Error $OUT/vllm-import.txt && exit 5
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
[ -f /root/llama-$shape/model.safetensors.index.json ] || python3 scripts/gpu/random_llama.py .carry/tok /root/llama-$shape $shape 2>&1 | tail -1 | tee $OUT/model.txt
(cd /root && CUDA_VISIBLE_DEVICES=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONPATH=/root/vsite \
  python3 -m vllm.entrypoints.openai.api_server --model /root/llama-$shape --load-format dummy \
  --dtype bfloat16 --gpu-memory-utilization 0.5 --enable-prefix-caching --max-model-len 4096 \
  --port 8000 --served-model-name llama-$shape-random > $OUT/vllm.log 2>&1) &
label="Llama-3.x-$shape shape, RANDOM WEIGHTS (timing only), vocab 49152, bf16"
export PYTHONPATH=$PWD:/root/site
CUDA_VISIBLE_DEVICES=0 python3 -m voicert.bench.replicas --model /root/llama-$shape --gpus 1 \
  --sessions "$sessions" --think 3 --new 48 --duration 20 --warmup 6 --json \
  2> $OUT/builtin.log > $OUT/builtin.json
for i in $(seq 1 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v1/models', timeout=2)" 2>/dev/null && break
  sleep 2
done
tail -3 $OUT/vllm.log
PYTHONPATH=$PWD:/root/site:/root/vsite python3 -m voicert.bench.replicas --model /root/llama-$shape --gpus "" --remote http://127.0.0.1:8000/v1 \
  --sessions "$sessions" --think 3 --new 48 --duration 20 --warmup 6 --json \
  2> $OUT/remote.log > $OUT/remote.json
python3 -c "
import json, sys
from voicert.bench.replicas import render
rows = json.load(open('$OUT/builtin.json')) + json.load(open('$OUT/remote.json'))
print(render(rows, sys.argv[1]))" "$label (built-in on GPU 0, vLLM 0.26.0 on GPU 1)" | tee $OUT/remote.md
tail -n 5 $OUT/remote.log $OUT/builtin.log
pkill -f vllm.entrypoints.openai.api_server  # the background server holds this command's output open
