#!/usr/bin/env bash
# CTranslate2 wheels from PyPI load libcublas.so.12. On a host with only CUDA 13 (cuBLAS 13), point a
# libcublas.so.12 name at the installed libcublas.so.13. Not needed where CUDA 12 is installed.
# Usage: source scripts/gpu/cublas-shim.sh   (prepends the shim dir to LD_LIBRARY_PATH)
shim=/tmp/voicert-cublas-shim; mkdir -p "$shim"
lib=$(python3 - <<'PY'
import glob, os
try:
    import torch
    roots = [os.path.join(os.path.dirname(torch.__file__), "..", "nvidia")]
except ImportError:
    roots = []
c = [p for r in roots for p in glob.glob(os.path.join(r, "**", "libcublas.so.13"), recursive=True)]
c += glob.glob("/usr/local/cuda*/lib64/libcublas.so.13")
print(os.path.realpath(c[0]) if c else "")
PY
)
[ -n "$lib" ] || { echo "cublas-shim: no libcublas.so.13 found" >&2; return 1 2>/dev/null || exit 1; }
ln -sf "$lib" "$shim/libcublas.so.12"
ln -sf "${lib/libcublas.so/libcublasLt.so}" "$shim/libcublasLt.so.12" 2>/dev/null || true
export LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
