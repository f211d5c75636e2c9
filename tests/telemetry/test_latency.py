from voicert.telemetry.latency import STAGES, Point, TurnTrace, format_table

TIMES_MS = {
    Point.VOICE_END: 0,
    Point.ASR_START: 390,
    Point.ENDPOINT_AUDIO: 390,  # the caller made it 8 ms before it was handled
    Point.ENDPOINT_HEARD: 398,
    Point.ENDPOINT: 400,
    Point.ASR_DONE: 420,
    Point.TRANSCRIPT: 421,
    Point.SUBMIT: 422,
    Point.PREFILL_START: 423,
    Point.FIRST_TOKEN_SAMPLED: 433,
    Point.FIRST_TOKEN_RECEIVED: 434,
    Point.FIRST_TOKEN_SENT: 435,
    Point.TTS_START: 450,
    Point.TTS_TAKEN: 451,
    Point.TTS_FIRST_CHUNK: 452.5,
    Point.FIRST_AUDIO_SENT: 453,
    Point.TOOL_CALL: 470,
    Point.DONE: 500,
}


def test_stages_come_from_marks_and_first_mark_wins():
    t = TurnTrace(1)
    for point, ms in TIMES_MS.items():
        t.mark(point, 10**9 + int(ms * 10**6))
    t.mark(Point.ENDPOINT, 10**9 + 999 * 10**6)  # ignored: first write wins
    s = t.stages_ms()
    assert s["endpoint_ms"] == 390.0 and s["ingest_ms"] == 10.0  # the caller's silence, the lag
    assert s["decide_ms"] == 2.0
    assert s["asr_ms"] == 21.0
    assert s["asr_wait_ms"] == -10.0  # the decode began before the endpoint (early final)
    assert s["asr_decode_ms"] == 30.0
    assert s["ttft_ms"] == 45.0  # from the audio the decision rests on, on the caller's clock
    assert s["voice_to_first_token_ms"] == 435.0
    assert s["tts_ms"] == 3.0 and s["ttfa_ms"] == 63.0 and s["voice_to_first_audio_ms"] == 453.0
    assert (s["tts_wait_ms"], s["tts_synth_ms"], s["tts_out_ms"]) == (1.0, 1.5, 0.5)
    assert s["tool_call_ms"] == 80.0
    assert set(s) == {st.name for st in STAGES}
    assert len(Point) == len(TIMES_MS)


def test_missing_points_leave_stages_out():
    t = TurnTrace(1)
    t.mark(Point.ENDPOINT, 0)
    t.mark(Point.TRANSCRIPT, 5_000_000)
    assert t.stages_ms() == {"asr_ms": 5.0}


def test_every_stage_is_documented_once():
    names = [s.name for s in STAGES]
    assert len(names) == len(set(names))
    assert all(s.doc for s in STAGES)


def test_table_has_a_column_per_present_stage():
    table = format_table([{"asr_ms": 1.25, "ttft_ms": 3.0}], labels=["7"])
    head, row = table.splitlines()
    assert head.split() == ["turn", "asr", "ttft"]
    assert row.split() == ["7", "1.2", "3.0"]
