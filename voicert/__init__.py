"""voicert: a streaming real-time voice agent backend."""

__version__ = "0.1.0"

# CTranslate2 (Whisper) before torch. Imported after torch, its OpenMP calls bind to torch's libgomp
# (loaded into the global scope) instead of the one in its wheel; its decode thread's team and the
# engine thread's then share one runtime, outnumber a small machine's cores, and libgomp stops
# letting either team's workers spin between parallel regions: on 2 cores every LLM decode step
# after the first Whisper decode took 34 ms instead of 20 (docs/benchmarks.md section 44). Its own
# runtime keeps its own count. A program that imported torch before voicert keeps the shared one.
try:
    import ctranslate2  # noqa: F401
except (ImportError, OSError):  # an optional speech stack, or a library it cannot load here
    pass
