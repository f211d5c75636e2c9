"""``python -m voicert.bench.profile_step``'s arguments (the bench itself needs a GPU)."""

import pytest

from voicert.bench import profile_step


@pytest.mark.parametrize("rows", ["-1", "17"])
def test_triton_linear_rows_outside_the_measured_tiles_end_with_a_message(rows, capsys):
    with pytest.raises(SystemExit) as exc:
        profile_step.main(["--triton-linear-rows", rows])
    assert (
        exc.value.code == 2 and "--triton-linear-rows must be in [0, 16]" in capsys.readouterr().err
    )


def test_fp8_mma_rows_without_fp8_weights_is_refused_not_ignored(capsys):
    with pytest.raises(SystemExit) as exc:
        profile_step.main(["--fp8-mma-rows", "4"])
    assert exc.value.code == 2 and "--fp8-mma-rows needs --fp8" in capsys.readouterr().err
