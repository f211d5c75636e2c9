"""The configured LLM engine, built from the config tree (``llm`` and ``models``): the built-in
engines under their supervisor, one per GPU behind :class:`~voicert.engine.clients.replicas.ReplicaEngine`,
or a client of an OpenAI-compatible server. No server imports: benchmarks build engines here too."""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from voicert.config import Config, ConfigError, LlmConfig, cache_dir
from voicert.core.llm import Engine
from voicert.engine.clients.llm_engine import LLMEngine
from voicert.engine.clients.simple import SimpleEngine
from voicert.engine.clients.supervisor import RestartPolicy, SupervisedEngine
from voicert.engine.loader import resolve_llm
from voicert.engine.settings import engine_config

if TYPE_CHECKING:
    from voicert.engine.clients.host import HostAddresses

log = logging.getLogger(__name__)


def build_engine(cfg: Config, hosts: HostAddresses | None = None) -> tuple[Config, Engine]:
    """The configured LLM engine (``llm.engine``) and the config as it resolved it. The built-in
    engines: weights resolved (and converted) by config, under a supervisor that rebuilds the
    engine if it fails (engine/clients/supervisor.py). ``openai``: a client of that server, ``llm.model``
    resolved by asking it (engine/clients/openai_compat.py). ``hosts`` (a front-end worker's): clients of
    the engine hosts the primary process started, each under its supervisor (one per GPU behind a
    :class:`~voicert.engine.clients.replicas.ReplicaEngine`)."""
    if cfg.llm.engine == "openai":
        from voicert.engine.clients.openai_compat import OpenAICompatEngine, resolve_model

        model = resolve_model(cfg.llm)
        log.info("llm: %s at %s", model, cfg.llm.base_url)
        cfg = dataclasses.replace(cfg, llm=dataclasses.replace(cfg.llm, model=model))
        return cfg, OpenAICompatEngine(cfg.llm, model)
    policy = RestartPolicy(
        max_restarts=cfg.llm.restart_max,
        window_s=cfg.llm.restart_window_s,
        wait_s=cfg.llm.restart_wait_s,
    )
    if hosts is None:
        check_device(cfg.llm)
    if hosts is not None:
        return cfg, _connect_hosts(hosts, policy, cfg.llm.restart_wait_s)
    model_dir = str(resolve_llm(cfg.models.llm, cache_dir(cfg.models)))
    if cfg.llm.gpus > 1:
        return cfg, _start_replicas(cfg, model_dir, policy)
    return cfg, SupervisedEngine(lambda: _start_engine(cfg, model_dir), policy)


def _start_replicas(cfg: Config, model_dir: str, policy: RestartPolicy) -> Engine:
    """``llm.gpus`` engine processes, one per GPU, started at once, each under its supervisor."""
    from voicert.engine.clients.remote import EngineProcess
    from voicert.engine.clients.replicas import ReplicaEngine

    engine_cfg = engine_config(cfg.llm, str(cache_dir(cfg.models)))

    def start(gpu: int) -> SupervisedEngine:
        return SupervisedEngine(
            lambda: EngineProcess(
                model_dir,
                engine_cfg,
                threads=cfg.llm.threads,
                gc_freeze=cfg.server.gc_freeze,
                gpu=str(gpu),
            ),
            policy,
        )

    with ThreadPoolExecutor(cfg.llm.gpus) as pool:
        futures = [pool.submit(start, i) for i in range(cfg.llm.gpus)]
        replicas, errors = [], []
        for f in futures:
            try:
                replicas.append(f.result())
            except Exception as exc:
                errors.append(exc)
    if errors:
        for r in replicas:
            r.close()
        raise errors[0]
    log.info("llm: %d engine replicas, one per GPU", len(replicas))
    return ReplicaEngine(replicas)


class _HostConnector:
    """Connects a worker to one engine host: the first time it waits for the host to load (up to
    ``START_WAIT_S``), later (the host died) for the one started in its place, up to ``wait_s``,
    after which the supervisor backs off and calls again."""

    START_WAIT_S = 600.0

    def __init__(self, hosts: HostAddresses, address: str, wait_s: float, tokenizer) -> None:
        self.hosts, self.address, self.tokenizer = hosts, address, tokenizer
        self.wait_s = max(wait_s, 1.0)
        self.timeout_s = self.START_WAIT_S

    def __call__(self):
        from voicert.engine.clients.host import SharedEngineClient

        client = SharedEngineClient(
            self.address, self.hosts.authkey, self.hosts.model_dir, self.timeout_s, self.tokenizer
        )
        self.timeout_s = self.wait_s
        return client


def _connect_hosts(hosts: HostAddresses, policy: RestartPolicy, wait_s: float) -> Engine:
    """A worker's engine: a supervised client of each engine host (several: replicas)."""
    from transformers import AutoTokenizer

    from voicert.engine.clients.replicas import ReplicaEngine

    tokenizer = AutoTokenizer.from_pretrained(hosts.model_dir)  # loaded once, for every link
    engines = [
        SupervisedEngine(_HostConnector(hosts, address, wait_s, tokenizer), policy)
        for address in hosts.addresses
    ]
    return engines[0] if len(engines) == 1 else ReplicaEngine(engines)


def check_device(llm: LlmConfig) -> None:
    """``llm.device`` names a device this machine has (raises ConfigError naming the key)."""
    if not llm.device.startswith("cuda") or llm.engine == "openai":
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(llm.device.partition(":")[2] or 0)
    if count == 0:
        why = (
            "torch here was built without CUDA"
            if torch.version.cuda is None
            else "torch sees no CUDA device"
        )
        raise ConfigError(
            f"llm.device: {llm.device}, but {why}; use cpu (or configs/gpu.yaml on a GPU machine)"
        )
    for gpu in range(llm.gpus):
        if index + gpu >= count:
            raise ConfigError(
                f"llm.device: {llm.device} with llm.gpus {llm.gpus}, but torch "
                f"sees {count} CUDA device(s)"
            )


def _start_engine(cfg: Config, model_dir: str):
    """One engine, started (and warmed up when it runs in this process)."""
    llm = cfg.llm
    if llm.engine == "simple":
        engine = SimpleEngine(model_dir, llm)
        engine.warmup()
        return engine
    engine_cfg = engine_config(llm, str(cache_dir(cfg.models)))
    if llm.process:
        from voicert.engine.clients.remote import EngineProcess

        return EngineProcess(
            model_dir, engine_cfg, threads=llm.threads, gc_freeze=cfg.server.gc_freeze
        )
    if llm.threads > 0:
        import torch

        torch.set_num_threads(llm.threads)
    fast = LLMEngine(model_dir, engine_cfg)
    fast.warmup()
    return fast
