#!/usr/bin/env bash
# Kernel switches timed side by side in one command: bench.engine on this tree as committed
# ("off") and on copies with one switch of the kernels turned, round-robin (docs/benchmarks.md
# 64-67):
#   unfused  INT4_PLANES_FUSED off (the one-row INT4 x laid out by its own launch)
#   rows1    INT4_GEMV_ROWS 1 (two rows by the MMA kernel)
#   rows4    INT4_GEMV_ROWS 4 (up to four rows on the CUDA cores)
#   narrow   GEMV_X_WIDE off (one-row FP8 weights' tile laid out apart from x's)
#   a8       --int4-activations int8 (one INT4 row: x rounded to int8 by group, dp4a; the
#            norms lay it out)
#   a8apart  a8 with INT4_PLANES_FUSED off (each Linear lays its own x out)
#   w8a16    --fp8-activations model (FP8 layers keep a step's rows in bf16: the widening kernel)
#   nofp8mm  FP8_MM_ROWS 0 (FP8 steps of 2-64 rows widen the weights in registers, as before
#            kernels.fp8_mm; docs/benchmarks.md 69)
#   imprecise  fp8_mm's sums left in the FP8 MMA's accumulator for all of K (Triton's sm_90
#            default), not added into fp32 after each tile
#   notma    FP8_MM_TMA off: fp8_mm's tiles read by the threads' loads, not TMA (section 71)
#   attn64   decode attention at 64 keys a step and 2 stages (_DECODE_BLOCK_N, _DECODE_STAGES;
#            10-14 % faster at 64 streams in bench.attention, 20 % slower at 32 x 200: section 72)
#   roped    ROPE_IN_ATTENTION_ROWS 1: every decode step's RoPE and KV write inside the paged
#            attention, one launch a layer fewer (the default takes it from 8 rows; section 74)
#   unroped  ROPE_IN_ATTENTION_ROWS 0: never (rope_kv_write launched at every step)
#   prenarrow GEMV_PRE_WIDE 1: 2-byte weights in eight-row tiles (1B's qkv, gate_up, LM head)
#            read one weight tile before the PDL wait, not a whole row of 2048 (section 76)
#   noglu    GEMV_GLU off: a one-row step's SiLU(gate) * up by silu_mul's own launch after
#            gate_up's gemv (the default takes it inside the gemv; section 75)
#   FLAGS=--fp8 VARIANTS="off notma" STREAMS=8,32,64 ROUNDS=2 bash scripts/gpu/variants.sh "8b"
#   ROUNDS=2 bash scripts/gpu/variants.sh "8b 1b"     outputs under $OUT (or ./variants-out)
#   VARIANTS="off rows1 rows4" STREAMS=2,4 ROUNDS=1 bash scripts/gpu/variants.sh "8b"
#   FLAGS=--fp8 VARIANTS="off narrow" bash scripts/gpu/variants.sh "8b"
#   FLAGS=--fp8 VARIANTS="off nofp8mm" STREAMS=2,8,32,64 ROUNDS=1 bash scripts/gpu/variants.sh "8b"
# FLAGS: the format (default --int4); EXTRA: more bench.engine flags for every side (e.g.
# "--quant-head"); VARIANTS: "off" and some of the above (default: off unfused); STREAMS: 1
# unless set; TAG: a prefix for the output files' names.
set -u
out=${OUT:-variants-out}
source "$(dirname "${BASH_SOURCE[0]}")/kernel-env.sh"
k=voicert/engine/gpu/kernels  # each setting is read on its own module there
for v in ${VARIANTS:-off unfused}; do
  tree=/tmp/variant-$v
  rm -rf "$tree" && mkdir -p "$tree" && cp -r voicert "$tree/"
  case $v in
    unfused) sed -i 's/^INT4_PLANES_FUSED = True/INT4_PLANES_FUSED = False/' "$tree/$k/int4_matmul.py" ;;
    rows1) sed -i 's/^INT4_GEMV_ROWS = [0-9]* /INT4_GEMV_ROWS = 1 /' "$tree/$k/int4_matmul.py" ;;
    rows4) sed -i 's/^INT4_GEMV_ROWS = [0-9]* /INT4_GEMV_ROWS = 4 /' "$tree/$k/int4_matmul.py" ;;
    narrow) sed -i 's/^GEMV_X_WIDE = True/GEMV_X_WIDE = False/' "$tree/$k/matvec.py" ;;
    a8apart) sed -i 's/^INT4_PLANES_FUSED = True/INT4_PLANES_FUSED = False/' "$tree/$k/int4_matmul.py" ;;
    nofp8mm) sed -i 's/^FP8_MM_ROWS = [0-9]* /FP8_MM_ROWS = 0 /' "$tree/$k/fp8_matmul.py" ;;
    imprecise) sed -i 's/, max_num_imprecise_acc=BLOCK_K)/)/' "$tree/$k/fp8_matmul.py" ;;
    notma) sed -i 's/^FP8_MM_TMA = True/FP8_MM_TMA = False/' "$tree/$k/fp8_matmul.py" ;;
    attn64) sed -i 's/^_DECODE_BLOCK_N = 0 /_DECODE_BLOCK_N = 64 /; s/^_DECODE_STAGES = 0 /_DECODE_STAGES = 2 /' "$tree/$k/attention.py" ;;
    roped) sed -i 's/^ROPE_IN_ATTENTION_ROWS = [0-9]* /ROPE_IN_ATTENTION_ROWS = 1 /' "$tree/$k/attention.py" ;;
    unroped) sed -i 's/^ROPE_IN_ATTENTION_ROWS = [0-9]* /ROPE_IN_ATTENTION_ROWS = 0 /' "$tree/$k/attention.py" ;;
    prenarrow) sed -i 's/^GEMV_PRE_WIDE = 2 /GEMV_PRE_WIDE = 1 /' "$tree/$k/matvec.py" ;;
    noglu) sed -i 's/^GEMV_GLU = True/GEMV_GLU = False/' "$tree/$k/matvec.py" ;;
  esac
  echo "$v: $(cat "$tree/$k"/*.py | grep -E '^(INT4_PLANES_FUSED|INT4_GEMV_ROWS|GEMV_X_WIDE|FP8_MM_ROWS|FP8_MM_TMA|_DECODE_BLOCK_N|_DECODE_STAGES|ROPE_IN_ATTENTION_ROWS|GEMV_GLU|GEMV_PRE_WIDE) =' \
    | cut -d'#' -f1 | tr '\n' ' ')"
done
for shape in $1; do
  for round in $(seq "${ROUNDS:-2}"); do
    for v in ${VARIANTS:-off unfused}; do
      case $v in
        a8 | a8apart) act="--int4-activations int8" ;;
        w8a16) act="--fp8-activations model" ;;
        *) act="" ;;
      esac
      (cd "/tmp/variant-$v" && PYTHONPATH=/tmp/variant-$v:/root/site python3 -m voicert.bench.engine \
        --model "llama-$shape-random" --device cuda ${FLAGS:---int4} --spec 0 --new-tokens 128 \
        --streams "${STREAMS:-1}" --reps 10 --kv-gb 4 --against none --no-baseline $act ${EXTRA:-}) \
        > "$out/engine-${TAG:-}$shape-$v-$round.txt" 2>&1
      echo "== ${TAG:-}$shape $v round $round"
      grep -E 'TPOT per stream, [0-9]+ streams, decode only \(P50\)' \
        "$out/engine-${TAG:-}$shape-$v-$round.txt"
    done
  done
done
