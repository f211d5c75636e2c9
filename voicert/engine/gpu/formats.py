"""Number formats the quantized layers and the kernels share (no Triton, no layers): the
kernels (the kernels package) sit below the layers that call them (fp8.py, int4.py), so what
both need lives here, under both."""

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
