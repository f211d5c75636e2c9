"""GPU code the models call when a GPU runs them: the fused Triton kernels (``kernels``), FP8 and
INT4 layer weights and their rounding (``fp8``, ``int4``), and those of GGUF and AWQ checkpoints
(``gguf``, ``awq``). It imports nothing of the models or the core above it. Each is tested on a
CPU through Triton's interpreter or a torch reference, and timed on a GPU (docs/gpu.md)."""
