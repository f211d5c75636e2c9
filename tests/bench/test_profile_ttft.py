"""bench/profile_ttft.py's command line: bad arguments end with a message naming them, before any
model is built; a CPU smoke run prints the phase table."""

import pytest

from voicert.bench import profile_ttft


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--rows", "500-100"], "CACHED+NEW"),
        (["--rows", "0+20"], "positive"),
        (["--rows", "10+x"], "CACHED+NEW"),
        (["--reps", "0"], "--reps"),
        (["--dtype", "fp4"], "--dtype"),
    ],
)
def test_bad_arguments_end_with_a_message_naming_them(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        profile_ttft.main(["--device", "cpu", *argv])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_a_cpu_smoke_run_prints_each_phase_of_a_cached_prompts_one_step(capsys):
    profile_ttft.main(
        [
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--model",
            "smollm2-random",
            "--reps",
            "1",
            "--rows",
            "40+8",
            "--no-kernels",
        ]
    )
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 40 + 8 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 1 + len(profile_ttft.PHASES) + 3
    assert all(float(c) >= 0 for c in cells[1 : 1 + len(profile_ttft.PHASES) + 1])
