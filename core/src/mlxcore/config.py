"""Server configuration: the parsed command line, core settings plus plugin options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class ServerConfig:
    """Everything ``mlxcore serve`` / ``mlxcore generate`` was told.

    Core settings are typed attributes; options that plugins added through
    ``mlxcore_addoption`` live in ``plugin_options`` (read them with :meth:`option`).
    Flag names follow vLLM's where the meaning is the same.
    """

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: tuple[str, ...] = ()
    log_level: str = "info"
    max_num_seqs: int = 16
    max_queue_size: int = 256
    max_model_len: int | None = None
    max_tokens_default: int = 512
    prefill_step_size: int = 512
    prefill_batch_size: int = 8
    prefix_cache_size: str = "32768"
    gpu_memory_utilization: float = 0.9
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    cache_strategy: str | None = None
    prefill_strategy: str | None = None
    decoder: str | None = None
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    max_request_body_bytes: int = 8 * 1024 * 1024
    mlx_cache_limit_bytes: int = 512 * 1024 * 1024
    max_queue_wait: float = 120.0
    engine_watchdog: float = 300.0
    engine_max_restarts: int = 3
    shutdown_timeout: float = 20.0
    prepare_workers: int = 2
    header_timeout: float = 30.0
    plugin_options: Mapping[str, Any] = attrs.field(factory=dict)

    def option(self, name: str, default: Any = None) -> Any:
        """A plugin option by its argparse ``dest`` name (``--my-flag`` -> ``my_flag``)."""
        return self.plugin_options.get(name, default)
