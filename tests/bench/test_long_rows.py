"""The long-row benchmark decodes short replies alone, beside a long one padded, and in key groups,
on the real embedded model, and reports each against the first."""

import re

from voicert.bench import long_rows


def test_the_long_row_bench_prints_the_three_cases_against_the_short_rows_alone(capsys):
    argv = ["--rounds", "1", "--steps", "2", "--long", "400", "--short", "2"]
    assert long_rows.main(argv) == 0
    out = capsys.readouterr().out
    for case in long_rows.CASES:
        assert re.search(rf"\| {case} \| [\d.]+ / [\d.]+ / [\d.]+ ms \| [\d.]+x \|", out), case
    assert "| short rows alone |" in out and "| 1.00x |" in out
