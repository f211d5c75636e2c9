"""The ``voicert`` commands: the client against the real server, and what ``serve`` says when it
cannot start."""

import asyncio

import pytest

from tests.conftest import DATA
from voicert import cli
from voicert.audio.wav import read_wav


async def test_client_prints_the_turn_and_writes_the_spoken_reply(url, tmp_path, capsys):
    out = tmp_path / "reply.wav"
    code = await asyncio.to_thread(cli.main, ["client", str(DATA / "capital_of_france.wav"),
                                              "--url", url, "--fast", "--speak", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Paris" in printed and "ttft" in printed and "wrote" in printed
    audio, rate = read_wav(out)
    assert rate == 24000 and 0.8 < audio.size / rate < 10 and abs(audio).max() > 0.05


def test_client_reports_an_unreachable_server(capsys):
    assert cli.main(["client", str(DATA / "capital_of_france.wav"), "--url",
                     "ws://127.0.0.1:9/v1/stream", "--fast"]) == 2
    assert "cannot connect" in capsys.readouterr().err


def test_an_llm_url_means_an_openai_compatible_server_and_its_errors_are_messages(capsys):
    args = cli.build_parser().parse_args(["serve", "--llm", "http://10.0.0.5:8000/v1"])
    assert cli._overrides(args) == {"llm.engine": "openai", "llm.base_url": "http://10.0.0.5:8000/v1"}
    assert cli._overrides(cli.build_parser().parse_args(["serve", "--llm", "x.gguf"])) == {
        "models.llm": "x.gguf"}
    code = cli.main(["prepare", "--llm", "http://127.0.0.1:9/v1",
                     "--set", "llm.connect_timeout_s=5"])
    assert code == 2
    err = capsys.readouterr().err
    assert "llm.model: not set" in err and "Traceback" not in err


def test_a_missing_llm_is_one_message_and_leaves_no_pending_task(capsys, caplog):
    import gc

    from voicert.cli import main

    code = main(["serve", "--port", "0", "--llm", "/nope", "--set", "tts.engine=none"])
    gc.collect()  # a task left pending is reported when it is collected
    assert code == 2
    assert "models.llm: /nope does not exist" in capsys.readouterr().err
    assert not [r for r in caplog.records if "was destroyed" in r.getMessage()]


@pytest.mark.parametrize("setting, message", [
    ("llm.device=cuda", "llm.device: cuda, but torch"),
    ("asr.device=cuda", "asr.device: cuda, but CTranslate2 sees no CUDA device")])
def test_a_gpu_setting_on_a_machine_without_one_is_a_message(setting, message, capsys):
    import torch

    from voicert.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = main(["serve", "--port", "0", "--set", setting, "--set", "tts.engine=none"])
    assert code == 2 and message in capsys.readouterr().err
