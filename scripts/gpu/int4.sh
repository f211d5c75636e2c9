#!/usr/bin/env bash
# INT4 layer weights (llm.int4) on the GPU machine: the compiled kernel tests, the kernel table
# (INT4 against bf16 F.linear at each Llama shape), then the engine bench, RANDOM WEIGHTS, with
# bf16, FP8 and INT4 weights one after the other on the same machine.
#   bash scripts/gpu/int4.sh "TESTS" "SHAPES" "WEIGHTS" [BLOCKS]
#   e.g. bash scripts/gpu/int4.sh "kernels" "1b 8b" "bf16 fp8 int4" 16x128x4x4,16x32x4x4
# TESTS: kernels | gpu | "kernels gpu" | none; SHAPES: none or Llama shapes (kernel table first);
# BLOCKS: extra INT4 tiles for the table (BMxBNxWARPSxSTAGES[xSPLIT]). Outputs go to $OUT.
set -u
out=${OUT:-int4-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
for t in $1; do
  [ "$t" = none ] && continue
  python3 -m pytest -q -p no:cacheprovider -o addopts="" "tests/engine/test_$t.py" \
    -k "int4 or fp8 or gptq" > "$out/test_$t.txt" 2>&1
  tail -3 "$out/test_$t.txt"
done
[ "$2" = none ] && exit 0
shapes=$(for s in $2; do printf "llama-%s," "$s"; done)
python3 -m voicert.bench.fp8 --no-quality --kernel int4 --shapes "${shapes%,}" \
  --rows 1,4,16,64,512 --blocks "${4:-}" > "$out/kernels-int4.txt" 2>&1
grep -E "^\||rror" "$out/kernels-int4.txt" | head -40
for shape in $2; do
  for w in $3; do
    flag=""
    [ "$w" = fp8 ] && flag="--fp8"
    [ "$w" = int4 ] && flag="--int4"
    python3 -m voicert.bench.engine --model "llama-$shape-random" --device cuda --no-baseline \
      $flag --spec 0 --new-tokens 128 --streams 1,64 --reps 10 --kv-gb 4 \
      > "$out/engine-$shape-$w.txt" 2>&1
    echo "== $shape $w"; grep -E "^\||rror" "$out/engine-$shape-$w.txt" | head -12
  done
done
