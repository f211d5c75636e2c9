#!/usr/bin/env bash
# Copies of this tree with parts of a one-row decode step taken out, to time what each part
# costs the step: bash scripts/gpu/steps.sh beside this tree (docs/benchmarks.md 75). Their
# output is WRONG: for timing only, never for tokens.
#   bash scripts/gpu/ablate.sh "noattn nokv noattn+nonorm"   -> /tmp/ablate-NAME/voicert
#   TREES="head=. noattn=/tmp/ablate-noattn" ROUNDS=2 bash scripts/gpu/steps.sh 1b
# Each name is one or more of these, joined by "+":
#   noattn  no attention launch at one query token: o reads q's slice of qkv
#   nokv    the decode attention's key loop empty (launch, q read, partial stores, merge kept)
#   nomerge the decode attention's splits merged by no one (each active split stores its part)
#   nonorm  no add_rms_norm launch at one row: the next Linear reads its input as it is
set -eu
att=voicert/engine/gpu/kernels/attention.py
norms=voicert/engine/gpu/kernels/norms.py

# insert FILE ANCHOR TEXT: TEXT after ANCHOR (which must be in FILE once)
insert() {
  python3 - "$@" <<'PY'
import sys
path, anchor, text = sys.argv[1:]
s = open(path).read()
assert s.count(anchor) == 1, f"{anchor!r} not once in {path}"
open(path, "w").write(s.replace(anchor, anchor + text))
PY
}

# swap FILE OLD NEW: OLD (in FILE once) replaced by NEW
swap() {
  python3 - "$@" <<'PY'
import sys
path, old, new = sys.argv[1:]
s = open(path).read()
assert s.count(old) == 1, f"{old!r} not once in {path}"
open(path, "w").write(s.replace(old, new))
PY
}

for name in $1; do
  tree=/tmp/ablate-$name
  rm -rf "$tree" && mkdir -p "$tree" && cp -r voicert "$tree/"
  for part in ${name//+/ }; do
    case $part in
      noattn) insert "$tree/$att" $'    _nb, bs, kvh, row = k_pool.shape\n' \
        $'    if q_len == 1 and rope is None:  # ABLATION\n        return qkv[..., : num_heads * (qkv.shape[-1] // (num_heads + 2 * kvh))]\n' ;;
      nokv) swap "$tree/$att" "for n0 in range(start, end, BLOCK_N):" \
        "for n0 in range(start, start, BLOCK_N):" ;;
      nomerge) swap "$tree/$att" 'if tl.atomic_add(count, 1, sem="acq_rel") == n_splits - 1:' \
        "if s < 0:" ;;
      nonorm) insert "$tree/$norms" $'    n = x.shape[-1]\n    out = torch.empty_like(x)\n' \
        $'    if x.numel() == n and planes is None:  # ABLATION\n        return x, (x if residual is None else residual)\n' ;;
      *) echo "unknown ablation $part" >&2; exit 2 ;;
    esac
  done
done
