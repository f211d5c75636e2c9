"""Server lifecycle: load models, serve routes on uvloop + websockets, shut down gracefully.

Shutdown order: stop accepting, stop starting new turns, let running turns finish, cancel the
rest, close every connection with 1001; all of it within ``server.shutdown_grace_s`` (the turns
get what ending streams and closing handshakes leave: 6 of the default 10 s).
"""

from __future__ import annotations

import asyncio
import http
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from websockets.asyncio.server import Server, ServerConnection
from websockets.http11 import Request, Response

from voicert.agent.session import Services
from voicert.agent.toolbox import Toolbox
from voicert.config import Config, ConfigError, cache_dir
from voicert.core.llm import EngineState
from voicert.core.speech import Asr
from voicert.engine.factory import build_engine
from voicert.engine.loader import download_llm, is_repo_id, llm_source
from voicert.hosting import limit_blas_threads, raise_fd_limit
from voicert.protocol import plivo, telnyx, twilio
from voicert.server import access, dashboard
from voicert.server.admission import Admission
from voicert.server.completions import CHAT_PATH, MODELS_PATH, ChatCompletions
from voicert.server.connection import CLOSE_GOING_AWAY, BaseConnection, Connection
from voicert.server.dashboard import ASSET_HEADERS, STATIC, static_file
from voicert.server.http import HttpRequest, HttpResponse, Listener, Routes, route_path, text
from voicert.server.logs import quiet_handshake_logger
from voicert.server.peers import WorkerRole
from voicert.server.realtime import REALTIME_PATH, RealtimeConnection
from voicert.server.telephony import phone_door
from voicert.speech import smart_turn
from voicert.speech.asr import asr_backend, build_asr, resolve_asr_model
from voicert.speech.denoise import RnNoise
from voicert.speech.host import host_judges
from voicert.speech.smart_turn import Judge, TurnJudge
from voicert.speech.tts import TtsWorker, first_piece_threads, load_voices
from voicert.speech.vad import SileroVad, VadBatcher
from voicert.telemetry.gcwatch import GcWatch, settle
from voicert.telemetry.latency import stages_js
from voicert.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from voicert.telemetry.metrics import Metrics
from voicert.telemetry.sampler import Sampler, SystemSample
from voicert.telemetry.tracing import TurnSpans, build_spans

log = logging.getLogger(__name__)
STREAM_PATH = "/v1/stream"
# each door: a path and what serves a socket on it (a telephony provider: its codec's door)
SESSION_ROUTES: dict[str, Callable[[ServerConnection, Services], BaseConnection]] = {
    STREAM_PATH: Connection,
    REALTIME_PATH: RealtimeConnection,
    "/twilio": phone_door(twilio.PROVIDER),
    "/telnyx": phone_door(telnyx.PROVIDER),
    "/plivo": phone_door(plivo.PROVIDER),
}
MAX_DASHBOARDS = 16
CLOSE_WAIT_S = 2.0  # at shutdown, how long closing handshakes may take before sockets are aborted
# (at most a fifth of server.shutdown_grace_s each: ending streams, then closing sockets)
MIN_CLOSE_S = 0.5  # ... but never less: a session's close cancels its engine request


def load_services(cfg: Config, hosts=None, speech: tuple[str, bytes] | None = None) -> Services:
    """Load and warm up VAD, ASR and the LLM (blocking; seconds once GGUF conversion is cached).
    A worker (``server.workers``) connects to its ``hosts`` (the engine) and ``speech`` (the
    speech host's address and key) instead of loading those here."""
    t0 = time.perf_counter()
    asr_backend(cfg.asr)  # first: a backend or a model wheel that is not there is said at once
    spans = turn_spans(cfg)
    check_models(cfg, speech, hosts)
    voices = load_voices(cfg.tts)  # a voice that is not there is said before the slow loads
    in_host = speech is not None and host_judges(cfg)  # the speech host runs the turn model
    judge: Judge | None = None if in_host else load_turn_judge(cfg)
    toolbox = Toolbox.from_config(cfg.tools)  # and a tool that does not import
    vad = SileroVad()
    asr: Asr
    if speech is not None:
        from voicert.speech.host import SharedAsr

        asr = SharedAsr(*speech)
        log.info("asr: the speech host (pid %d) after %.1f s", asr.pid, time.perf_counter() - t0)
        if in_host:
            from voicert.speech.host import HostJudge

            judge = HostJudge(asr)
            log.info("turn detection: %s, judged by the speech host", cfg.turn.detector)
    else:
        asr = build_asr(cfg.asr, str(resolve_asr_model(cfg.models.asr, cache_dir(cfg.models))))
        asr.warmup()
        log.info(
            "asr ready (%s, %s) after %.1f s",
            cfg.asr.backend,
            cfg.models.asr,
            time.perf_counter() - t0,
        )
    cfg, engine = build_engine(cfg, hosts)
    log.info("llm ready after %.1f s", time.perf_counter() - t0)
    tts = (
        TtsWorker(voices, threads=cfg.tts.workers, first_threads=first_piece_threads(cfg.tts))
        if voices
        else None
    )
    if tts is not None:
        tts.warmup()
        log.info(
            "tts ready (%s, %d Hz; sessions may pick %s)",
            tts.voice.name or cfg.tts.engine,
            tts.sample_rate,
            ", ".join(voices),
        )
    vad_pool = (
        ThreadPoolExecutor(cfg.vad.threads, thread_name_prefix="voicert-vad")
        if cfg.vad.threads > 0
        else None
    )
    vad_batcher = VadBatcher(vad, vad_pool, in_flight=cfg.vad.threads)
    if cfg.server.gc_freeze:
        log.info("gc: %d loaded objects exempted from collection", settle())
    return Services(
        cfg=cfg,
        vad=vad,
        asr=asr,
        engine=engine,
        metrics=Metrics(cfg.telemetry.budget_ms, cfg.telemetry.recent_turns),
        tts=tts,
        vad_pool=vad_pool,
        vad_batcher=vad_batcher,
        gc_watch=GcWatch().install(),
        turn_judge=judge,
        denoise=RnNoise() if cfg.asr.denoise == "rnnoise" else None,
        toolbox=toolbox,
        spans=spans,
    )


def turn_spans(cfg: Config) -> TurnSpans | None:
    """The OpenTelemetry turn spans ``telemetry.otel_endpoint`` asks for (None: off). Raises
    ConfigError naming the key when OpenTelemetry is not installed."""
    t = cfg.telemetry
    try:
        return build_spans(t.otel_endpoint, t.otel_service, cfg.models.llm)
    except ImportError as exc:
        raise ConfigError(f"config telemetry.otel_endpoint: {exc}") from None


def where_to_start(host: str, port: int) -> str:
    """The line a newcomer needs at start-up: the page to open and the client command, with
    the port this server took (a wildcard address is reached as localhost)."""
    near = "localhost" if host in ("", "0.0.0.0", "::") else host
    near = f"[{near}]" if ":" in near else near
    return (
        f"open http://{near}:{port}/ in a browser (the dashboard: /dashboard), or: "
        f"voicert client YOUR.wav --url ws://{near}:{port}{STREAM_PATH}"
    )


def check_models(cfg: Config, speech=None, hosts=None) -> None:
    """The model files this process will load, found (or a ConfigError naming the key) before
    anything slow loads: a mistyped ``--asr`` or ``--llm`` is said in a second, not after the
    other models. A worker (``speech``, ``hosts``) loads neither: the primary checked them."""
    cache = cache_dir(cfg.models)
    if speech is None:
        resolve_asr_model(cfg.models.asr, cache)
    if hosts is None and cfg.llm.engine != "openai":
        if is_repo_id(cfg.models.llm):
            download_llm(cfg.models.llm)  # first: its progress, or "offline", before other loads
        else:
            llm_source(cfg.models.llm)


def load_turn_judge(cfg: Config) -> TurnJudge | None:
    """The turn-completion model when ``turn.detector`` judges pauses (semantic, hazard) with an
    audio model (raises SmartTurnMissing, a ConfigError, when its wheel is not installed)."""
    if cfg.turn.detector == "silence" or cfg.turn.model == "none":
        return None
    t = cfg.turn
    model = smart_turn.load(t.model_path, t.device, t.audio_head, t.threads)
    judge = TurnJudge(model, cfg.turn.concurrency)
    judge.warmup()
    log.info(
        "turn detection: %s (%s%s, judged at %d ms of silence, at most %d ms)",
        cfg.turn.detector,
        judge.model.path.name,
        " with its pause head" if model.head is not None else "",
        cfg.turn.pause_ms,
        cfg.turn.max_silence_ms,
    )
    return judge


@dataclass
class VoiceServer:
    """Routes and lifecycle. ``services`` may arrive after the socket is listening (models still
    loading): until then /healthz answers, /readyz says 503 and every other route 503 "loading"."""

    services: Services | None = None
    config: Config | None = None
    connections: set[BaseConnection] = field(default_factory=set)
    dashboard_conns: set[ServerConnection] = field(default_factory=set)
    _server: Listener | None = None  # while listening
    _listener: Listener | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    sampler: Sampler | None = None  # the process's one telemetry sampler
    admission: Admission | None = None  # server.admission: the door closes while behind
    completions: ChatCompletions | None = None  # the chat completions route (its requests)
    _stopping_samplers: set[asyncio.Task] = field(default_factory=set)
    exit_code: int = 0  # non-zero when the server stopped because a part could not be kept up
    role: WorkerRole | None = None  # one of several workers (server.workers): its socket, hosts
    # a stop while the models load: False waits for the loading thread (then frees what it
    # loaded); True leaves it (``abandoned``) for a caller that exits the process at once
    abandon_loading_on_stop: bool = False
    abandoned: bool = False

    @property
    def cfg(self) -> Config:
        if self.services is not None:
            return self.services.cfg
        if self.config is None:
            raise ValueError("a VoiceServer needs services or a config")
        return self.config

    def unready_reason(self) -> str | None:
        """Why new work is refused now (the first part that is not up), or None when ready:
        models loaded and warmed up, the engine and speech workers up, not shutting down."""
        svc = self.services
        if svc is None:
            return "loading models"
        if svc.draining:
            return "shutting down"
        if not svc.engine.healthy:
            return "engine restarting"
        if not svc.asr.alive:
            return "speech recognition down"  # a speech host reconnecting, or its worker gone
        if svc.tts is not None and not svc.tts.alive:
            return "voice down"
        return None

    def _on_give_up(self, why: str) -> None:
        """A supervisor could not bring its part back (any thread): stop serving, exit non-zero."""
        log.critical("stopping: %s could not be kept up", why)
        self.exit_code = 3
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._stopping.set)

    def routes(self) -> Routes:
        """The route table: plain HTTP by method and path, and the WebSocket doors."""
        routes = Routes(cors=self._cors_allowed)
        routes.add("GET", "/healthz", self._healthz)
        routes.add("GET", "/readyz", self._readyz)
        routes.add("GET", "/metrics", self._metrics)
        for path in STATIC:
            routes.add("GET", path, self._static)
        routes.add("GET", "/stages.js", self._stages_js)
        chat = self.completions = ChatCompletions(lambda: self.services, self.unready_reason)
        routes.add("POST", CHAT_PATH, chat.completions)
        routes.add("GET", MODELS_PATH, chat.models)
        for path in (*SESSION_ROUTES, dashboard.FEED_PATH):
            routes.add_websocket(path)
        return routes

    async def _healthz(self, request: HttpRequest) -> HttpResponse:
        return text(http.HTTPStatus.OK, "ok\n")

    def _cors_allowed(self, origin: str, host: str | None) -> bool:
        """May a page on ``origin`` use the HTTP routes (server.allowed_origins, as the
        WebSocket routes admit it)?"""
        return access.origin_allowed(
            origin, host, access.split_list(self.cfg.server.allowed_origins)
        )

    async def _readyz(self, request: HttpRequest) -> HttpResponse:
        """200 when a new session would be taken now; 503 naming why not (a part down, or this
        process at its session or connection limit: a load balancer sends callers elsewhere)."""
        why = self.unready_reason() or self.full_reason()
        if why is None:
            return text(http.HTTPStatus.OK, "ready\n")
        return text(http.HTTPStatus.SERVICE_UNAVAILABLE, f"not ready ({why})\n")

    async def _metrics(self, request: HttpRequest) -> HttpResponse:
        if self.services is None:
            return text(http.HTTPStatus.SERVICE_UNAVAILABLE, "loading models\n")
        self._sampler_for(self.services).sample()
        return HttpResponse(
            http.HTTPStatus.OK, self.services.metrics.exposition(), METRICS_CONTENT_TYPE
        )

    async def _stages_js(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(
            http.HTTPStatus.OK,
            stages_js().encode(),
            "text/javascript; charset=utf-8",
            list(ASSET_HEADERS),
        )

    async def _static(self, request: HttpRequest) -> HttpResponse:
        found = static_file(request.path)
        if found is None:  # (routed only for the static paths)
            return text(http.HTTPStatus.NOT_FOUND, "not found\n")
        body, content_type, headers = found
        return HttpResponse(http.HTTPStatus.OK, body, content_type, headers)

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        """Checks before a WebSocket handshake completes: route, loading, access, limits."""
        path, _ = route_path(request.path)
        if self._listener is None or path not in self._listener.routes.websocket:
            return ws.respond(http.HTTPStatus.NOT_FOUND, f"no route {path}\n")
        if self.services is None:
            return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "loading models\n")
        refusal = self._refuse(ws, request)
        if refusal is not None:
            return refusal
        if path == dashboard.FEED_PATH:
            if len(self.dashboard_conns) >= MAX_DASHBOARDS:
                return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "too many dashboards\n")
            return None
        if self.services.draining:
            return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
        why = self.unready_reason()
        if why is not None:
            return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, f"not ready ({why})\n")
        full = self.full_reason()
        if full is not None:
            refused = ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, f"{full}\n")
            refused.headers["Retry-After"] = str(self._retry_after_s())
            return refused
        return None

    def _retry_after_s(self) -> int:
        """When a refused caller may try again: after a calm interval while admission is
        closed, else in a second."""
        if self.admission is not None and self.admission.closed:
            return math.ceil(self.admission.calm_s)
        return 1

    def full_reason(self) -> str | None:
        """Why this process takes no new session now (its share of ``server.max_sessions`` or
        ``server.max_connections`` is in use), or None."""
        s = self.cfg.server
        if self.services is not None and self.services.metrics.active_sessions >= s.max_sessions:
            return f"session limit ({s.max_sessions}) reached"
        if len(self.connections) >= s.max_connections:
            return f"connection limit ({s.max_connections}) reached"
        if self.admission is not None and self.services is not None:
            return self.admission.refusal(self.services.metrics.active_sessions)
        return None

    def _refuse(self, ws: ServerConnection, request: Request) -> Response | None:
        """Bearer token and origin checks for a WebSocket route (see server/access.py)."""
        s = self.cfg.server
        single = access.single_values(request.headers.raw_items())
        refusal = (
            single
            if isinstance(single, access.Refusal)
            else access.check(
                request.path,
                single.get("Authorization"),
                single.get("Origin"),
                access.split_list(s.auth_tokens),
                access.split_list(s.allowed_origins),
                single.get("Host"),
            )
        )
        if refusal is None:
            return None
        log.info("refused %s: %s", route_path(request.path)[0], refusal.reason)
        response = ws.respond(refusal.status, refusal.reason + "\n")
        for name, value in refusal.headers:
            response.headers[name] = value
        return response

    async def _handler(self, ws: ServerConnection) -> None:
        svc = self.services
        assert svc is not None  # sockets are refused (503) until the models are loaded
        path = route_path(ws.request.path)[0] if ws.request is not None else STREAM_PATH
        if path == dashboard.FEED_PATH:
            self.dashboard_conns.add(ws)
            try:
                await dashboard.feed(ws, svc, self._sampler_for(svc))
            finally:
                self.dashboard_conns.discard(ws)
            return
        conn = SESSION_ROUTES[path](ws, svc)
        self.connections.add(conn)
        try:
            if isinstance(conn, RealtimeConnection) and not await conn.open():
                return
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def start(self) -> None:
        s = self.cfg.server
        self._loop = asyncio.get_running_loop()
        if self.services is not None:
            self._watch_services(self.services)
        ws_server = Server(
            self._handler, process_request=self._process_request, logger=quiet_handshake_logger()
        )
        self._listener = Listener(
            self.routes(),
            ws_server,
            max_body_bytes=s.max_message_bytes,
            ws_options=dict(
                max_size=s.max_message_bytes, max_queue=64, ping_interval=20, ping_timeout=20
            ),
            allowed_hosts=access.split_list(s.allowed_hosts),
            max_open=s.max_connections,
        )
        if self.role is not None:
            await self._listener.start(s.host, s.port, sock=self.role.sock)
            log.info("worker %d serving on port %d", self.role.index, self.port)
        else:
            await self._listener.start(s.host, s.port)
            log.info("voicert listening on ws://%s:%d%s", s.host, self.port, STREAM_PATH)
            log.info("%s", where_to_start(s.host, self.port))
        self._server = self._listener

    def _sampler_for(self, svc: Services) -> Sampler:
        """The process's one sampler (started with the services; also made on first use)."""
        if self.sampler is None or self.sampler.svc is not svc:
            if self.sampler is not None:
                old = asyncio.ensure_future(self.sampler.stop())
                self._stopping_samplers.add(old)  # held until it is done
                old.add_done_callback(self._stopping_samplers.discard)
            self.sampler = Sampler(svc)
            s = svc.cfg.server
            if s.admission:
                self.admission = Admission(
                    s.admission_lag_ms, s.admission_calm_s, svc.cfg.telemetry.budget_ms
                )
                self.sampler.listeners.add(self._admit)
            self.sampler.start()
        return self.sampler

    def _admit(self, sample: SystemSample) -> None:
        """Each sampling interval: whether new sessions are still taken (server/admission.py)."""
        admission, svc = self.admission, self.services
        if admission is None or svc is None:
            return
        was = admission.closed
        lag = max(sample.ingest_lag_ms, sample.loop_lag_ms)
        admission.observe(time.monotonic(), lag, svc.metrics.active_sessions, sample.ttfts_ms)
        svc.metrics.admission_closed.set(float(admission.closed))
        if admission.closed != was:
            if admission.closed:
                log.warning(
                    "admission closed with %d sessions in: %s; new sessions get 503 until it "
                    "catches up",
                    svc.metrics.active_sessions,
                    admission.why,
                )
            else:
                log.warning("admission open again (at most %s sessions)", admission.ceiling)

    def _watch_services(self, svc: Services) -> None:
        """Sample their figures; hear from the engine's supervisor and the speech workers if they
        give up."""
        self._sampler_for(svc)
        svc.engine.on_give_up = self._on_give_up
        svc.asr.on_give_up = self._on_give_up
        if svc.tts is not None:
            svc.tts.on_give_up = self._on_give_up
        if svc.engine.state is EngineState.FAILED:
            self._on_give_up(svc.engine.last_failure or "engine failed")

    def _join_peers(self, svc: Services) -> None:
        """A worker: its turns and figures to the other workers' dashboards and theirs to ours;
        stop if the primary is gone."""
        role = self.role
        assert role is not None  # only a worker joins its peers
        bus = role.bus
        svc.metrics.publish = bus.publish
        sampler = self._sampler_for(svc)
        sampler.publish = bus.publish_sample

        def primary_gone() -> None:
            if not self._stopping.is_set():
                log.error("the primary process is gone: shutting down")
                self._stopping.set()

        bus.on_primary_gone = primary_gone
        bus.start(asyncio.get_running_loop(), svc.metrics.add_peer_turn, sampler.add_peer_sample)

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.port

    async def shutdown(self) -> None:
        """Stop accepting; let running turns finish within the grace period; close the rest."""
        if self._server is None:
            return
        if self.services is None:  # stopped while loading
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            return
        # draining: still listening, so /readyz answers 503 ("shutting down") and new sessions
        # and completions are refused with it, while running turns and completions finish
        self.services.draining = True
        # the grace covers the whole shutdown: turns get what the two closing steps leave
        grace = self.cfg.server.shutdown_grace_s
        close_s = min(CLOSE_WAIT_S, max(grace / 5, MIN_CLOSE_S))
        turns_s = max(grace - 2 * close_s, grace / 2)  # (a grace under 2.5 s runs over a little)
        sessions = [c.session for c in list(self.connections) if c.session is not None]
        if sessions:
            log.info("shutdown: waiting up to %.1f s for %d session(s)", turns_s, len(sessions))
        await asyncio.gather(
            *(s.wait_turn(turns_s) for s in sessions), self._server.wait_requests(turns_s)
        )
        if self.completions is not None:  # still running: each ends with an error and [DONE]
            self.completions.end_all()
        await self._server.wait_requests(close_s)
        self._server.close(close_connections=False)
        # every connection at once: a peer that never answers the close costs its own close
        # timeout, not everyone's; whatever is still open after CLOSE_WAIT_S is aborted
        sockets = [c.ws for c in self.connections] + list(self.dashboard_conns)
        closing = [asyncio.ensure_future(self._close(c)) for c in list(self.connections)]
        closing += [
            asyncio.ensure_future(ws.close(CLOSE_GOING_AWAY, "server shutting down"))
            for ws in self.dashboard_conns
        ]
        if closing:
            _done, late = await asyncio.wait(closing, timeout=close_s)
            for task in late:
                task.cancel()
            for ws in sockets:
                if ws.transport is not None and not ws.transport.is_closing():
                    ws.transport.abort()
            await asyncio.gather(*closing, return_exceptions=True)
        self._server.abort_requests()
        await self._server.wait_closed()
        self._server = None
        if self.sampler is not None:
            await self.sampler.stop()

    @staticmethod
    async def _close(conn: BaseConnection) -> None:
        if conn.session is not None:
            await conn.session.close("cancelled")
        await conn.ws.close(CLOSE_GOING_AWAY, "server shutting down")

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            if signals > 1:
                log.warning("second signal: exiting now")
                raise SystemExit(1)
            log.info("signal received: shutting down (again to force)")
            self._stopping.set()

        # a worker hears signals from the primary only (SIGTERM), not the terminal's Ctrl-C
        for sig in (signal.SIGTERM,) if self.role else (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
            except (NotImplementedError, RuntimeError):
                pass
        await self.start()
        if self.services is None:  # listen (healthz, readyz) while the models load
            role = self.role
            loading = asyncio.ensure_future(
                asyncio.to_thread(
                    load_services,
                    self.cfg,
                    role.hosts if role else None,
                    role.speech if role else None,
                )
            )
            stop = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({loading, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not loading.done():  # a thread cannot be interrupted
                await self.shutdown()
                if self.abandon_loading_on_stop:
                    self.abandoned = True
                    return
                self._discard(await loading)  # let it finish, then free what it loaded
                return
            stop.cancel()  # (not left pending when the loop closes)
            if loading.exception() is not None:  # a config error, a model that would not load
                await self.shutdown()  # stop listening; the error is the caller's to report
            self.services = loading.result()
            self._watch_services(self.services)
            if self.role is not None:
                self._join_peers(self.services)
            log.info("ready")
        await self._stopping.wait()
        await self.shutdown()

    @staticmethod
    def _discard(services: Services) -> None:
        if services.gc_watch is not None:
            services.gc_watch.remove()
        services.engine.close()
        services.asr.close()
        if services.tts is not None:
            services.tts.close()
        if services.vad_pool is not None:
            services.vad_pool.shutdown(wait=False, cancel_futures=True)
        if isinstance(services.turn_judge, TurnJudge):
            services.turn_judge.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when importable, asyncio's default loop otherwise."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


WEBSOCKETS_MAJORS = (13, 14, 15)  # the asyncio Server API used here (pyproject pins <16)


def websockets_problem(version: str) -> str | None:
    """Why the installed websockets (``version``) cannot serve, or None when it can."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    if major in WEBSOCKETS_MAJORS:
        return None
    return (
        f"websockets {version} is installed; the server runs on websockets 13-15 (its "
        f"asyncio Server API changed in 16): pip install 'websockets>=13,<16'"
    )


def run_server(cfg: Config, role: WorkerRole | None = None) -> int:
    """One server process: listen at once; load and warm the models; serve until
    SIGINT/SIGTERM; shut down gracefully. ``role``: this process is one of several workers
    (server/workers.py, whose ``serve`` is ``voicert serve``). 2 when it cannot start (a
    message says why)."""
    sys.setswitchinterval(cfg.server.gil_switch_interval_ms / 1000)
    limit_blas_threads(cfg.server.blas_threads)
    before, after = raise_fd_limit()
    if after != before:
        log.info("open files: soft limit raised from %d to %d", before, after)
    server = VoiceServer(config=cfg, role=role, abandon_loading_on_stop=True)
    loop = new_event_loop()
    try:
        loop.run_until_complete(server.serve_until_stopped())
    finally:
        if server.services is not None:
            VoiceServer._discard(server.services)
    if server.abandoned:  # Ctrl-C while loading: not another ~10 s for models no one will use
        log.info("start-up interrupted: exiting without waiting for the models to load")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(server.exit_code)
    loop.close()
    return server.exit_code
