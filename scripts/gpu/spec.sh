#!/usr/bin/env bash
# Speculation by batch size on the GPU machine (issue 17, item 5): the GPU tests of speculation,
# then python -m voicert.bench.spec. Needs /root/models/SmolLM2-135M-Instruct.Q4_1.gguf and
# /root/whl (gguf, msgspec, llguidance), sent as .carry/sb parts with scripts/gpu/receive.sh.
# Usage: bash scripts/gpu/spec.sh tests|heads|ngram|ngram1b   (reports under $OUT)
set -uo pipefail
[ -d /root/site/msgspec ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site /root/whl/*.whl
source scripts/gpu/env.sh
gguf=/root/models/SmolLM2-135M-Instruct.Q4_1.gguf
nvidia-smi -L > "$OUT/device.txt"
case "$1" in
  tests) python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py -k "speculat or draft or overlap" > "$OUT/tests.log" 2>&1 ;;
  heads) python3 -m voicert.bench.spec --model "$gguf" --drafter heads --k 2 --streams 1,4,16,64 --rounds 3 --kv-gb 4 > "$OUT/spec-heads.md" 2> "$OUT/spec-heads.log" ;;
  ngram) python3 -m voicert.bench.spec --model "$gguf" --drafter ngram --k 4 --streams 1,4,16,64 --rounds 3 --kv-gb 4 > "$OUT/spec-ngram.md" 2> "$OUT/spec-ngram.log" ;;
  ngram1b) python3 -m voicert.bench.spec --model llama-1b-random --drafter ngram --k 4 --streams 1,16,64 --rounds 2 --kv-gb 8 > "$OUT/spec-1b.md" 2> "$OUT/spec-1b.log" ;;
esac
echo "rc=$?"
