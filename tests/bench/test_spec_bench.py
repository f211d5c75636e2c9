"""bench.spec without a model: its table from made-up figures, and bad options refused first."""

import argparse

import pytest

from voicert.bench.spec import Level, main, render
from voicert.engine.core.spec_policy import SpecDecision


def level(tpot: float, tokens: int, wall: float, replies, verify: int = 0, plain: int = 0):
    return Level([tpot, tpot], [100.0, 120.0], tokens, wall, replies, verify, plain)


def test_the_table_gives_ratios_against_plain_the_verify_share_and_identical_replies():
    args = argparse.Namespace(drafter="heads", k=2, rounds=3, temperature=0.0)
    same, other = [[1, 2], [3, 4]], [[1, 2], [3, 5]]
    results = {
        2: {
            "plain": level(2.0, 100, 1.0, same),
            "always": level(1.0, 100, 0.5, same),
            "adaptive": level(1.6, 100, 0.8, other, verify=30, plain=10),
        }
    }
    text = render("m", args, results, [SpecDecision(2, 1.0, 1.3, True)])
    row = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "1.00 ms (2.00x)" in row and "1.60 ms (1.25x)" in row and "200 (2.00x)" in row
    assert "75%" in row and "2/2 / 1/2" in row
    assert "| 2 | 1.00 ms | 1.30 ms | yes |" in text
    assert "sampled" not in text
    sampled = render("m", argparse.Namespace(**{**vars(args), "temperature": 0.7}), results, [])
    assert "sampled at temperature 0.7" in sampled  # its replies are not expected to match


@pytest.mark.parametrize(
    "argv",
    [
        ["--drafter", "heads", "--model", "llama-1b-random"],
        ["--streams", "1,x"],
        ["--k", "0"],
        ["--temperature", "2.5"],
    ],
)
def test_bad_options_are_a_usage_error_before_any_model_loads(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "error" in capsys.readouterr().err


def test_a_model_that_cannot_be_found_is_a_message_not_a_traceback(tmp_path, capsys):
    assert main(["--model", str(tmp_path / "none.gguf"), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.startswith("bench.spec: ")
