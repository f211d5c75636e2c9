"""The ASR evaluation set through the real server (streaming) and offline faster-whisper."""

from voicert.bench.asr_eval import (
    edit_distance,
    evaluate,
    load_set,
    markdown,
    normalize,
    wer,
    whisper_normalize,
)


def test_wer_arithmetic():
    assert normalize("Hello, World! 5") == ["hello", "world", "five"]
    assert edit_distance(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert wer([("a b c d", "a b c d")]) == 0.0
    assert wer([("a b c d", "a c d")]) == 25.0


def test_whisper_normalized_wer_counts_digits_and_words_for_numbers_alike():
    ref = "Tuesday the fourteenth at ten with Doctor Patel."
    heard = "Tuesday the 14th at 10 with Dr. Patel."
    assert wer([(ref, heard)]) >= 25.0  # "fourteenth", "doctor": the strict count misses
    assert wer([(ref, heard)], whisper_normalize) == 0.0
    assert wer([(ref, "Thursday the 14th at 10 with Dr. Patel.")], whisper_normalize) > 0.0


def test_eval_set_covers_voices_noise_and_telephony():
    utts = load_set()
    assert len(utts) >= 30
    conds = {u.condition for u in utts}
    assert {"clean", "noise", "mulaw", "noise_mulaw"} <= conds
    assert all(u.path.is_file() for u in utts)


async def test_streaming_wer_within_two_points_of_offline(url, services):
    """Every other utterance of the set (16, every condition among them: the whole set is
    ``python -m voicert.bench.asr_eval``'s), streamed and decoded offline."""
    utts = load_set()[::2]
    assert {u.condition for u in utts} == {u.condition for u in load_set()}
    result = await evaluate(url, services.asr.model, utts, callers=8)
    print("\n" + markdown(result))
    w = result["wer"]["all"]
    assert (
        w["offline_wer"] < 50.0
    )  # sanity (tiny.en on synthetic voices: ~33 %); a broken path gives ~100
    assert w["streaming_wer"] <= w["offline_wer"] + 2.0
