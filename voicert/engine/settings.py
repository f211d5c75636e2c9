"""The engine's settings: :class:`EngineConfig` is the ``llm`` section itself (its defaults and
its checks) plus what only a caller that builds an engine sets; :func:`engine_config` makes one
from the config tree. It imports nothing of the engine, so the core that steps with these
settings and the build that reads them both stand above it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from voicert.config import ConfigError, LlmConfig


@dataclass(slots=True)
class EngineConfig(LlmConfig):
    """The engine's settings: every ``llm`` key with its one default and its checks, and two that
    only a caller building an engine itself sets. Options of the other kind of device are off
    where the engine runs (:meth:`on_device`): CUDA graphs, the engine's own stream and the fused
    kernels on a CPU, TorchScript on a GPU."""

    num_blocks: int = 0  # KV blocks in the pool; 0: sized from kv_memory_gb
    models_cache: str = ""  # where a GGUF draft model is converted (the server's models.cache_dir)

    def __post_init__(self) -> None:
        LlmConfig.__post_init__(self)
        if self.num_blocks < 0 or self.num_blocks == 1:
            raise ConfigError("num_blocks: must be 0 (sized from llm.kv_memory_gb) or >= 2")

    def on_device(self) -> EngineConfig:
        """These settings as they apply on ``device``."""
        cuda = self.device.startswith("cuda")
        return dataclasses.replace(
            self,
            cuda_graphs=self.cuda_graphs and cuda,
            own_stream=self.own_stream and cuda,
            fused_kernels=self.fused_kernels and cuda,
            torchscript=self.torchscript and not cuda,
        )


def engine_config(llm: LlmConfig, models_cache: str = "") -> EngineConfig:
    """The engine's settings from the config tree's ``llm`` section (every key, as it is)."""
    values = {f.name: getattr(llm, f.name) for f in dataclasses.fields(llm)}
    return EngineConfig(**values, models_cache=models_cache)
