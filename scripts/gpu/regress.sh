#!/usr/bin/env bash
# The engine against an earlier commit's, side by side in one command (the same machine, the same
# minutes): bench.engine on each shape, base then head then base then head, and first (TESTS=gpu)
# this tree's GPU tests. The earlier tree travels as .carry/base (git archive COMMIT voicert).
#   TESTS=gpu ROUNDS=2 bash scripts/gpu/regress.sh "1b"      outputs under $OUT (or ./regress-out)
# EXTRA: more bench.engine flags for both sides (e.g. "--fp8 --quant-head"); STREAMS: 1,64 unless set;
# TAG: a name for the output files (default: the shape). KTESTS: a -k expression of
# tests/engine/test_kernels.py to run compiled first.
set -u
out=${OUT:-regress-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
head=$PWD
base=$PWD/${BASE:-.carry/base}
if [ "${TESTS:-}" = gpu ]; then
  VOICERT_TEST_TOKENIZER=$PWD/.carry/tok timeout 300 python3 -m pytest -q -p no:cacheprovider \
    -o addopts="" tests/engine/test_gpu.py "tests/engine/test_architectures.py" -k "gpu" \
    > "$out/tests.txt" 2>&1
  tail -3 "$out/tests.txt"
fi
if [ -n "${KTESTS:-}" ]; then  # the kernel tests compiled, e.g. KTESTS="gemv or pdl or one"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/engine/test_kernels.py \
    -k "$KTESTS" > "$out/kernel-tests.txt" 2>&1
  tail -3 "$out/kernel-tests.txt"
fi
for shape in $1; do
  for round in $(seq "${ROUNDS:-2}"); do
    for side in base head; do
      tree=$base; [ "$side" = head ] && tree=$head
      (cd "$tree" && PYTHONPATH=$tree:/root/site python3 -m voicert.bench.engine \
        --model "llama-$shape-random" --device cuda --spec 0 --new-tokens 128 --streams "${STREAMS:-1,64}" \
        --reps 10 --kv-gb 4 --against none --no-baseline ${EXTRA:-}) \
        > "$out/engine-${TAG:-$shape}-$side-$round.txt" 2>&1
      echo "== $shape $side round $round"
      grep -E "TPOT, batch 1|TPOT per stream, (1|64) streams, decode only|TTFT, 600" \
        "$out/engine-${TAG:-$shape}-$side-$round.txt"
    done
  done
done
