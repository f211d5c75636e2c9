from voicert.telemetry.latency import STAGES, Point, TurnTrace, format_table


def test_stages_come_from_marks_and_first_mark_wins():
    t = TurnTrace(1)
    base = 1_000_000_000
    for i, point in enumerate(Point):
        t.mark(point, base + i * 2_000_000)
    t.mark(Point.ENDPOINT, base + 999_000_000)  # ignored: first write wins
    s = t.stages_ms()
    assert s["endpoint_ms"] == 2.0
    assert s["asr_ms"] == 2.0
    assert s["ttft_ms"] == 12.0  # ENDPOINT (1) -> FIRST_TOKEN_SENT (7)
    assert s["voice_to_first_token_ms"] == 14.0
    assert set(s) == {st.name for st in STAGES}


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
