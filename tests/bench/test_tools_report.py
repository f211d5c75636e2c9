"""bench.tools' report: figures it has, and words where it has none (never NaN)."""


def test_the_tool_report_says_when_no_call_was_timed():
    from voicert.bench.tools import pct, render_eval

    row = {"text": "hi", "want": None, "called": None, "arguments": "", "tool_call_ms": None}
    report = {
        "n": 1,
        "config": "c",
        "choice": "auto",
        "llm": "m",
        "device": "cpu",
        "rows": [row],
        "right": 1,
        "right_when_a_tool_is_wanted": 0,
        "n_wanted": 0,
        "called_when_none_is_wanted": 0,
        "tool_call_ms": {"p50": pct([], 50), "p95": pct([], 95), "n": 0},
        "ttft_ms": {"p50": pct([], 50)},
    }
    text = render_eval(report)
    assert "nan" not in text and "no call was made" in text
