"""GPU code the core calls when a GPU runs it: the fused Triton kernels (``kernels``), FP8 weights
(``fp8``) and FlashAttention-4 prefill (``flash``). Each is tested on a CPU through Triton's
interpreter or a torch reference, and timed on a GPU (docs/gpu.md)."""
