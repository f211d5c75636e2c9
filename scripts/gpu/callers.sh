#!/usr/bin/env bash
# Callers per H100 on the Llama-3.1-8B shape (RANDOM WEIGHTS, timing only), one weight format per
# engine build, side by side in one command: python -m voicert.bench.replicas with simulated voice
# calls (a turn: ~3 s of talking, a 48-token reply, heard at 3 tokens a second before the next turn)
# and each format's most sessions within P99 TTFT <= 100 ms.
# Carry: .carry/gptq (msgspec + llguidance cp312) and .carry/tok (the embedded tokenizer).
# Usage: bash scripts/gpu/callers.sh "bf16:384,512 fp8:512,640 int4:384,512" [replicas args...]
# (random weights: FP8 and INT4 rounded to nearest; the rounding changes no timing)
set -uo pipefail
plan=${1:-"bf16:256,384,512 fp8:256,384,512 int4:256,384,512"}
shift || true
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site .carry/gptq/*.whl
export PYTHONPATH=$PWD:/root/site
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a $OUT/gpu.txt
date -u | tee -a $OUT/gpu.txt
if [ ! -f /root/llama-8b/config.json ]; then
  t0=$(date +%s)
  python3 scripts/gpu/random_llama.py .carry/tok /root/llama-8b 8b 2>&1 | tail -1
  echo "model written in $(( $(date +%s) - t0 )) s"
fi
for item in $plan; do
  weights=${item%%:*}
  sessions=${item#*:}
  case $weights in
    bf16) set=() ;;
    fp8) set=(--set llm.fp8=true --set llm.rounding=nearest) ;;
    int4) set=(--set llm.int4=true --set llm.rounding=nearest) ;;
    *) echo "unknown weights: $weights"; exit 2 ;;
  esac
  label="Llama-3.1-8B shape, RANDOM WEIGHTS (timing only), vocab 49152, $weights weights"
  python3 -m voicert.bench.replicas --model /root/llama-8b --label "$label" --gpus 1 \
    --sessions "$sessions" --think 3 --new 48 --listen 3 --duration ${DURATION:-20} \
    --warmup ${WARMUP:-8} --p99-bar 100 "${set[@]}" "$@" \
    2> >(tee -a $OUT/callers-$weights.log >&2) | tee $OUT/callers-$weights.md
  date -u
done
