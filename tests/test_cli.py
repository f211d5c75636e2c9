"""The ``voicert`` commands: the client against the real server, and what ``serve`` says when it
cannot start."""

import asyncio

import pytest

from tests.conftest import DATA
from voicert import cli
from voicert.audio.wav import read_wav


async def test_client_prints_the_turn_and_writes_the_spoken_reply(url, tmp_path, capsys):
    out = tmp_path / "reply.wav"
    code = await asyncio.to_thread(
        cli.main,
        [
            "client",
            str(DATA / "capital_of_france.wav"),
            "--url",
            url,
            "--fast",
            "--speak",
            str(out),
            "--voice",
            "en-us+f3",
        ],
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Paris" in printed and "ttft" in printed and "wrote" in printed
    assert "; voice en-us+f3, offered: " in printed and "en-gb-x-rp" in printed  # the session line
    audio, rate = read_wav(out)
    assert rate == 24000 and 0.8 < audio.size / rate < 10 and abs(audio).max() > 0.05


async def test_client_names_the_voices_when_asked_for_one_the_server_lacks(url, tmp_path, capsys):
    code = await asyncio.to_thread(
        cli.main,
        [
            "client",
            str(DATA / "capital_of_france.wav"),
            "--url",
            url,
            "--fast",
            "--speak",
            str(tmp_path / "r.wav"),
            "--voice",
            "alloy",
        ],
    )
    err = capsys.readouterr().err
    assert code == 2 and "voice 'alloy' is not offered here (offered: " in err
    assert "Traceback" not in err


def test_client_refuses_a_voice_without_spoken_replies(capsys):
    wav = str(DATA / "capital_of_france.wav")
    assert cli.main(["client", wav, "--voice", "en-us+f3", "--url", "ws://127.0.0.1:9/x"]) == 2
    err = capsys.readouterr().err
    assert "add --speak" in err and "Traceback" not in err


def test_client_reports_an_unreachable_server(capsys):
    assert (
        cli.main(
            [
                "client",
                str(DATA / "capital_of_france.wav"),
                "--url",
                "ws://127.0.0.1:9/v1/stream",
                "--fast",
            ]
        )
        == 2
    )
    assert "cannot connect" in capsys.readouterr().err


def test_an_llm_url_means_an_openai_compatible_server_and_its_errors_are_messages(capsys):
    args = cli.build_parser().parse_args(["serve", "--llm", "http://10.0.0.5:8000/v1"])
    assert cli._overrides(args) == {
        "llm.engine": "openai",
        "llm.base_url": "http://10.0.0.5:8000/v1",
    }
    assert cli._overrides(cli.build_parser().parse_args(["serve", "--llm", "x.gguf"])) == {
        "models.llm": "x.gguf"
    }
    code = cli.main(
        ["prepare", "--llm", "http://127.0.0.1:9/v1", "--set", "llm.connect_timeout_s=5"]
    )
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


@pytest.mark.parametrize(
    "flag, said",
    [("--llm", "models.llm: /nope does not exist"), ("--asr", "models.asr: /nope is not")],
)
def test_a_mistyped_model_is_said_before_any_other_model_loads(capsys, monkeypatch, flag, said):
    from voicert.cli import main
    from voicert.server import app

    def too_soon(*args, **kwargs):
        raise AssertionError("a model loaded before the names were checked")

    monkeypatch.setattr(app, "SileroVad", too_soon)
    monkeypatch.setattr(app, "load_turn_judge", too_soon)
    code = main(["serve", "--port", "0", flag, "/nope", "--set", "tts.engine=none"])
    assert code == 2 and said in capsys.readouterr().err


def test_a_websockets_release_the_server_cannot_run_on_is_named_not_a_traceback(
    capsys, caplog, monkeypatch
):
    # websockets 16+ changed the asyncio Server API (seen on a machine whose bundle had 17.4:
    # a TypeError traceback from deep in the start-up)
    import websockets

    from voicert.cli import main
    from voicert.server.app import websockets_problem

    assert websockets_problem(websockets.__version__) is None  # the installed one serves
    monkeypatch.setattr(websockets, "__version__", "17.4")
    code = main(["serve", "--port", "0", "--set", "tts.engine=none"])
    assert code == 2 and "could not start" in capsys.readouterr().err
    assert any(
        "websockets 17.4 is installed" in r.getMessage()
        and "'websockets>=13,<16'" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize(
    "setting, message",
    [
        ("llm.device=cuda", "llm.device: cuda, but torch"),
        ("asr.device=cuda", "asr.device: cuda, but CTranslate2 sees no CUDA device"),
    ],
)
def test_a_gpu_setting_on_a_machine_without_one_is_a_message(setting, message, capsys):
    import torch

    from voicert.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = main(["serve", "--port", "0", "--set", setting, "--set", "tts.engine=none"])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, content, said",
    [
        ("missing.wav", None, "missing.wav: no such file"),
        ("notes.wav", b"hello, this is text\n", "notes.wav: not a WAV file"),
        (
            "song.wav",
            b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(64),
            "song.wav: an MP3 file, not a WAV",
        ),
        ("empty.wav", b"", "empty.wav: not a WAV file"),
        (
            "adpcm.wav",
            b"RIFF\x2c\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x02\x00\x01\x00\x80\x3e\x00\x00"
            b"\x00\x1f\x00\x00\x02\x00\x04\x00data\x08\x00\x00\x00" + bytes(8),
            "adpcm.wav: unsupported WAV encoding (format tag 2, 4-bit)",
        ),
    ],
)
def test_client_says_what_is_wrong_with_a_file_in_one_line(tmp_path, capsys, name, content, said):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["client", str(path), "--url", "ws://127.0.0.1:9/v1/stream"]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.count(name) <= 2 and err.count("not a WAV") <= 1  # said once (and ffmpeg's)
    if content:
        assert "ffmpeg -i" in err  # and how to make one


def test_client_takes_the_server_url_as_users_type_it():
    from voicert.client import ClientError, stream_url

    assert stream_url("ws://h:1/v1/stream") == "ws://h:1/v1/stream"
    assert stream_url("http://h:8765") == "ws://h:8765/v1/stream"
    assert stream_url("https://voice.example.com/") == "wss://voice.example.com/v1/stream"
    assert stream_url("HTTP://h:1/v1/stream?token=t") == "ws://h:1/v1/stream?token=t"
    for bad in ("ftp://h/x", "h:8765", "ws://"):
        with pytest.raises(ClientError, match="ws://HOST:PORT"):
            stream_url(bad)


def test_every_client_finds_the_server_from_one_setting(monkeypatch):
    from loadgen import abuse, phone
    from voicert.client import door_url, server_env

    assert server_env({}) == "ws://127.0.0.1:8765"
    assert server_env({"VOICERT_URL": "http://box:9000"}) == "http://box:9000"
    assert door_url("http://box:9000", "/telnyx") == "ws://box:9000/telnyx"  # the provider's door
    assert door_url("wss://box/v1/stream", "", http=True) == "https://box"  # the HTTP API's base
    assert door_url("ws://box:9000/plivo", "/twilio") == "ws://box:9000/plivo"  # a path is kept
    calls = []

    async def call(url, clips, provider):
        calls.append((url, provider))
        return phone.CallResult()

    monkeypatch.setattr(phone, "call", call)
    monkeypatch.setattr(phone, "read_wav", lambda path: (None, 8000))
    phone.main(["--provider", "plivo", "ws://box:9000", "x.wav", "--no-transcripts"])
    assert calls == [("ws://box:9000/plivo", "plivo")]
    monkeypatch.setenv("VOICERT_URL", "ws://box:9000/v1/stream")
    seen = []

    async def run(url, *args):
        seen.append(url)
        return "table"

    monkeypatch.setattr(abuse, "run", run)
    assert abuse.main(["--seconds", "1"]) == 0  # the default, read when main runs
    assert seen == ["http://box:9000"]


def _failing_stream(exc):
    async def stream_audio(*args, **kwargs):
        raise exc

    return stream_audio


def _unauthorized():
    from websockets.datastructures import Headers
    from websockets.exceptions import InvalidStatus
    from websockets.http11 import Response

    return InvalidStatus(Response(401, "Unauthorized", Headers()))


def _going_away():
    from websockets.exceptions import ConnectionClosedError
    from websockets.frames import Close

    return ConnectionClosedError(Close(1001, "server shutting down"), None)


@pytest.mark.parametrize(
    "exc, code, said",
    [
        (KeyboardInterrupt(), 130, "interrupted"),
        (_going_away(), 2, "the server closed the connection (1001 server shutting down)"),
        (_unauthorized(), 2, "HTTP 401; it wants a token: give --token"),
        (TimeoutError(), 2, "no answer from ws://h:1/v1/stream within 120 s"),
    ],
)
def test_client_interruptions_and_refusals_are_messages(monkeypatch, capsys, exc, code, said):
    from voicert import client

    monkeypatch.setattr(client, "stream_audio", _failing_stream(exc))
    assert cli.main(["client", str(DATA / "count_to_five.wav"), "--url", "http://h:1"]) == code
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


async def test_client_says_a_clip_had_no_speech_and_goes_on_to_the_next(url, tmp_path, capsys):
    import numpy as np

    from voicert.audio.wav import write_wav

    silent = tmp_path / "silent.wav"
    write_wav(silent, np.zeros(16000, np.float32), 16000)
    http = url.replace("ws://", "http://").removesuffix("/v1/stream")  # as a user may type it
    code = await asyncio.to_thread(
        cli.main,
        ["client", str(silent), str(DATA / "capital_of_france.wav"), "--url", http, "--fast"],
    )
    out, err = capsys.readouterr()
    assert code == 1 and "Paris" in out
    assert "silent.wav: the server heard no speech in it" in err and "Traceback" not in err


def test_ctrl_c_while_the_models_load_exits_at_once():
    """The models load on a thread that cannot be interrupted: a Ctrl-C during start-up exits
    without waiting for them (it used to go on loading for ~10 s), and says so."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "voicert", "serve", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in proc.stderr:  # the socket listens before the models load
            lines.append(line)
            if "listening on" in line:
                break
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    said = "".join(lines) + rest
    assert proc.returncode == 0 and "start-up interrupted" in said
    assert "llm ready" not in said and "Traceback" not in said


def test_version_prints_the_package_version(capsys):
    import importlib.metadata

    import pytest

    from voicert.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"voicert {importlib.metadata.version('voicert')}"


async def test_client_takes_typed_turns_after_the_spoken_ones(url, capsys):
    wav = str(DATA / "capital_of_france.wav")
    code = await asyncio.to_thread(
        cli.main, ["client", wav, "--url", url, "--fast", "--text", "And Germany?"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.index("Paris") < printed.index("you:   And Germany?")
    assert "Berlin" in printed.split("you:   And Germany?")[1]


def test_client_without_a_wav_or_text_says_so(capsys):
    assert cli.main(["client", "--url", "ws://127.0.0.1:9/x"]) == 2
    assert "give WAV files, --text TEXT, or --mic" in capsys.readouterr().err


def test_client_shows_tool_calls_and_their_outputs(capsys):
    from voicert.client import show_event

    show_event({"type": "tool.call", "name": "book", "arguments": '{"n": 4}', "server": True})
    show_event({"type": "tool.output", "output": "booked", "error": False})
    printed = capsys.readouterr().out
    assert '[tool call book({"n": 4}): the server runs it]' in printed
    assert "[tool output: booked]" in printed


def test_client_refuses_an_empty_text_itself(capsys):
    assert cli.main(["client", "--text", "  ", "--url", "ws://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err == "voicert client: --text is empty: give the words to send\n"


def test_a_missing_llm_is_said_before_the_server_listens(capsys, monkeypatch):
    from voicert.cli import main
    from voicert.server import workers

    def listens(cfg):
        raise AssertionError("the server started listening with a model path that is not there")

    monkeypatch.setattr(workers, "serve", listens)
    code = main(["serve", "--port", "0", "--llm", "/nonexistent/model.gguf"])
    assert code == 2
    assert (
        capsys.readouterr().err == "voicert: models.llm: /nonexistent/model.gguf does not exist\n"
    )


@pytest.mark.parametrize("path", ["/v1/realtime", "/twilio", "/telnyx", "/plivo", "/v1/dashboard"])
def test_the_client_pointed_at_another_door_says_which_at_once(capsys, path):
    assert cli.main(["client", "--url", f"http://127.0.0.1:9{path}", "--text", "hi"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"voicert client: --url http://127.0.0.1:9{path}: that is ")
    assert line.endswith("speaks the native protocol: --url ws://127.0.0.1:9/v1/stream")


def test_the_clients_list_of_other_doors_is_the_servers():
    from voicert.client import OTHER_DOORS, STREAM_PATH
    from voicert.server import app, dashboard

    assert set(OTHER_DOORS) == {*app.SESSION_ROUTES, dashboard.FEED_PATH} - {STREAM_PATH}


def test_serve_help_names_the_hub_form_and_the_listening_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "org/name" in text and "Qwen/Qwen2.5-1.5B-Instruct" in text
    assert "--host HOST the address to listen on" in text
    assert "--port PORT the port to listen on" in text
