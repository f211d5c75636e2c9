#!/usr/bin/env bash
# GPU time of one decode step, trees side by side (bench.profile_step's "replays back to back":
# the step's CUDA graph replayed without host gaps), round-robin on the same warm machine. Finer
# than bench.engine's TPOT for changes worth ~1 % (docs/benchmarks.md 72, 73).
#   TREES="base=.carry/old head=." ROUNDS=2 bash scripts/gpu/steps.sh "1b 8b"   (outputs under $OUT)
# TREES: name=path pairs, each path holding a voicert/ package (variants.sh leaves
# /tmp/variant-NAME); FLAGS: more profile_step flags (default "--triton-linear-rows 1"; e.g.
# "--fp8"); CONTEXT: 600 unless set; BATCH: 1 unless set; TAG: a prefix for the files' names.
set -u
out=${OUT:-steps-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
for shape in $1; do
  for round in $(seq "${ROUNDS:-2}"); do
    for pair in ${TREES:-base=.carry/old head=.}; do
      name=${pair%%=*}
      tree=$(cd "${pair#*=}" && pwd)
      (cd "$tree" && PYTHONPATH=$tree:/root/site python3 -m voicert.bench.profile_step \
        --model "llama-$shape-random" --batch "${BATCH:-1}" --context "${CONTEXT:-600}" \
        ${FLAGS:---triton-linear-rows 1}) > "$out/step-${TAG:-}$shape-$name-$round.txt" 2>&1
      echo "$shape $name round $round: $(grep -oE 'replays back to back [0-9.]+ ms' "$out/step-${TAG:-}$shape-$name-$round.txt")"
    done
  done
done
