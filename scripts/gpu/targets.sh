#!/usr/bin/env bash
# Issue 44's TPOT targets in one call on the GPU machine (meant for an H100, where they are set):
# bench.engine at batch 1, RANDOM WEIGHTS, ROUNDS rounds each, and a table of each figure (P50,
# ms) against its limit. "FP8 not behind vLLM" needs the vLLM bundle: scripts/gpu/engine-vllm.sh
# (docs/benchmarks.md 71); INT4's top-1 agreement is measured on the CPU (section 63).
#   ROUNDS=2 bash scripts/gpu/targets.sh          outputs under $OUT (or ./targets-out)
set -u
out=${OUT:-targets-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
# name | model | flags | limit (ms)
targets=(
  "1B bf16|llama-1b-random||1.0"
  "8B FP8|llama-8b-random|--fp8|3.3"
  "8B INT4 (W4A8, INT4 head)|llama-8b-random|--int4 --int4-activations int8 --quant-head|2.0"
)
rows=()
for t in "${targets[@]}"; do
  IFS='|' read -r name model flags limit <<< "$t"
  got=()
  for round in $(seq "${ROUNDS:-2}"); do
    log="$out/target-${model}-$(echo "$flags" | tr -cd 'a-z0-9')-$round.txt"
    python3 -m voicert.bench.engine --model "$model" --device cuda $flags --spec 0 \
      --new-tokens 128 --streams 1 --reps 10 --kv-gb 4 --against none --no-baseline > "$log" 2>&1
    got+=("$(grep -E 'TPOT per stream, 1 streams, decode only \(P50\)' "$log" \
      | grep -oE '[0-9]+\.[0-9]+ ms' | head -1 | cut -d' ' -f1)")
  done
  worst=$(printf "%s\n" "${got[@]}" | grep -E "^[0-9.]+$" | sort -n | tail -1)  # met only if every round is
  met=$(python3 -c "import sys; b=sys.argv[1]; print('no figure' if not b else 'met' if float(b) <= float(sys.argv[2]) else 'missed by %.0f %%' % (100 * (float(b) / float(sys.argv[2]) - 1)))" "$worst" "$limit")
  rows+=("| $name | $(IFS=/; echo "${got[*]}") | <= $limit | $met |")
done
{
  echo "### Issue 44's TPOT targets, $(cat "$out/gpu.txt"), $(date -u +%F)"
  echo
  echo "| shape | TPOT P50, batch 1 (ms, each round) | target | |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/targets.md"
