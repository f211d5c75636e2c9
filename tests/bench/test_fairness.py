"""The prefill fairness benchmark runs both policies on the real embedded model and reports each."""

from voicert.bench import fairness


def test_the_fairness_bench_prints_both_policies(capsys):
    assert fairness.main(["--runs", "1", "--long", "600", "--short", "8"]) == 0
    out = capsys.readouterr().out
    assert "| first come (before) |" in out and "| fair |" in out
    assert "long prompt 600 tokens" in out
