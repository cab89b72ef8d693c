"""Server configuration: the parsed command line, core settings plus plugin options.

Each core setting is declared once, here, with its default, type, flag and help
(:func:`mlxcore.settings.setting`); ``mlxcore serve`` / ``generate`` / ``bench``
generate their flags from these fields, so a flag and its field cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from mlxcore.settings import (
    byte_size,
    header_value,
    json_object,
    log_level,
    non_negative_int,
    positive_int,
    seconds,
    setting,
    time_share,
)

COMMON, ENGINE, PARSERS, HTTP = "common", "engine", "parsers", "http"
"""Flag groups: every command / model-serving commands / their parsers / ``serve`` only."""


@attrs.frozen
class ServerConfig:
    """Everything ``mlxcore serve`` / ``mlxcore generate`` was told.

    Core settings are typed attributes; options that plugins added through
    ``mlxcore_addoption`` live in ``plugin_options`` (read them with :meth:`option`,
    or as a typed object with :func:`mlxcore.settings.read_settings`).
    Flag names follow vLLM's where the meaning is the same.
    """

    model: str | None = None
    """The positional model argument (a folder, a repo id, a .gguf file; ``None``: the
    embedded default)."""
    log_level: str = setting(
        "info",
        group=COMMON,
        type=log_level,
        help="log level for mlxcore and uvicorn: critical, error, warning, info, debug (any case)",
    )
    log_format: str = setting(
        "text", group=COMMON, choices=("text", "json"),
        help="log lines as text or as one JSON object each (time, level, logger, message, "
        "request_id)",
    )  # fmt: skip
    # -- engine ------------------------------------------------------------
    max_num_seqs: int = setting(
        32, group=ENGINE, type=positive_int,
        help="most sequences decoded together (each also needs its cache to fit the memory "
        "budget before it starts)",
    )  # fmt: skip
    max_queue_size: int = setting(
        256, group=ENGINE, type=positive_int,
        help="most requests waiting",
    )  # fmt: skip
    max_model_len: int | None = setting(
        None, group=ENGINE, type=positive_int,
        help="context length limit (default: the model's own, cut to what one sequence's "
        "cache fits in the memory left beside the weights; stated at start-up and in "
        "/v1/models)",
    )  # fmt: skip
    default_max_tokens: int = setting(
        512, group=ENGINE, type=positive_int, metavar="N",
        help="tokens a chat request may generate when it sets no max_tokens "
        "(capped by the context)",
    )  # fmt: skip
    prefill_step_size: int = setting(
        2048, group=ENGINE, type=positive_int,
        help="prefill chunk size",
    )  # fmt: skip
    prefill_decode_chunk: int = setting(
        256, group=ENGINE, type=non_negative_int,
        help="prefill tokens per engine step while other sequences decode (long prompts are "
        "split so running streams keep their pace); 0: the full --prefill-step-size",
    )  # fmt: skip
    prefill_time_share: float = setting(
        1.0, group=ENGINE, type=time_share, metavar="SHARE",
        help="while sequences decode, a long prompt's prefill chunk is sized to add at most "
        "SHARE decode steps' measured time (0 to 8; at least 16 tokens, at most "
        "--prefill-decode-chunk), so running streams keep a steady inter-token latency; "
        "0: the token budget alone (always 0 with --distributed)",
    )  # fmt: skip
    step_time_target: float = setting(
        1.0, group=ENGINE, type=seconds, metavar="SECONDS",
        help="with nothing decoding, a step's prefill work is sized from measured costs to "
        "last about SECONDS (at least 64 tokens, at most --prefill-step-size), so a request "
        "arriving during a long prompt is admitted within about that; a step over twice "
        "this is logged with its requests; 0: --prefill-step-size tokens a step",
    )  # fmt: skip
    max_batched_tokens: int | None = setting(
        None, group=ENGINE, type=positive_int, metavar="N",
        help="a fixed step budget (vLLM's name): each step prefills at most N prompt tokens, "
        "with or without decoding streams, and no step is sized in time (default: sized in "
        "time, see --prefill-time-share and --step-time-target; stated at start-up)",
    )  # fmt: skip
    prefill_batch_size: int = setting(
        8, group=ENGINE, type=positive_int,
        help="most waiting prompts prefilled together in one forward pass (1: one at a time)",
    )  # fmt: skip
    prefix_cache_size: str = setting(
        "auto", group=ENGINE,
        help="prefix cache budget: auto (default: the memory left beside the weights, the "
        "running requests' worst case and a 10%% headroom, shared by the models served; "
        "stated at start-up and on /health), tokens (e.g. 32768) or a size (e.g. 512MB); "
        "0 disables",
    )  # fmt: skip
    kv_cache_dtype: str = setting(
        "auto", group=ENGINE, choices=("auto", "int8", "int4"),
        help="attention KV cache storage (vLLM's name): auto keeps the model's dtype; int8 / "
        "int4 quantize keys and values (mlx-lm's kv_bits), ~2x / ~4x less memory per token",
    )  # fmt: skip
    kv_quant_start: int = setting(
        0, group=ENGINE, type=non_negative_int, metavar="N",
        help="with --kv-cache-dtype int8/int4: a sequence's cache stays in full precision "
        "until its context reaches N tokens (mlx-lm's --quantized-kv-start)",
    )  # fmt: skip
    kv_group_size: int = setting(
        64, group=ENGINE, type=int, choices=(32, 64, 128),
        help="with --kv-cache-dtype int8/int4: values per quantization scale",
    )  # fmt: skip
    gpu_memory_utilization: float = setting(
        0.9, group=ENGINE, type=float,
        help="fraction of memory MLX may use (vLLM's name)",
    )  # fmt: skip
    mlx_cache_limit: int = setting(
        512 * 1024 * 1024, group=ENGINE, type=byte_size,
        metavar="SIZE",
        help="most memory MLX keeps in its buffer cache for reuse (e.g. 512MB, 0); the rest "
        "is given back (default 512MiB)",
    )  # fmt: skip
    max_queue_wait: float = setting(
        120.0, group=ENGINE, type=seconds, metavar="SECONDS",
        help="a request waiting longer than this to start is answered as overloaded "
        "(503 with Retry-After; 0: no limit)",
    )  # fmt: skip
    burst_gather: float = setting(
        0.004, group=ENGINE, type=seconds, metavar="SECONDS",
        help="requests reaching an idle engine less than SECONDS apart start together (one "
        "prefill batch: no stream waits on the next arrivals' joins); the first waits at "
        "most 5 x SECONDS (0: each starts at once)",
    )  # fmt: skip
    priority_aging: float = setting(
        5.0, group=ENGINE, type=seconds, metavar="SECONDS",
        help="a waiting request gains one priority level for each SECONDS it waits, so "
        "lower priorities still start under sustained higher-priority load (0: strict "
        "priorities)",
    )  # fmt: skip
    background_priority: int = setting(
        1_000_000, group=ENGINE, type=int, metavar="N",
        help="requests at priority N or above are background work (the batch plugin's "
        "lines): they start only in idle capacity, once no other request has been waiting "
        "or running for --background-grace seconds",
    )  # fmt: skip
    background_grace: float = setting(
        2.0, group=ENGINE, type=seconds, metavar="SECONDS",
        help="how long after the last interactive request background work still waits to "
        "start (interactive traffic comes in bursts: an agent's next turn; 0: start at once)",
    )  # fmt: skip
    engine_watchdog: float = setting(
        300.0, group=ENGINE, type=seconds, metavar="SECONDS",
        help="an engine step making no progress this long is a fault: its requests fail, "
        "the engine restarts (0: off)",
    )  # fmt: skip
    engine_max_restarts: int = setting(
        3, group=ENGINE, type=int, metavar="N",
        help="engine restarts allowed in ten minutes; past them the server exits non-zero",
    )  # fmt: skip
    cache_strategy: str | None = setting(
        None, group=ENGINE, metavar="NAME",
        help="pick a cache strategy by name (built in: radix, the default; lru: whole entries)",
    )  # fmt: skip
    prefill_strategy: str | None = setting(
        None, group=ENGINE, metavar="NAME",
        help="pick a prefill strategy by name",
    )  # fmt: skip
    decoder: str | None = setting(None, group=ENGINE, metavar="NAME", help="pick a decoder by name")
    # -- parsers -----------------------------------------------------------
    tool_call_parser: str = setting(
        "auto", group=PARSERS, metavar="NAME",
        help="tool-call parser name, or auto",
    )  # fmt: skip
    reasoning_parser: str = setting(
        "auto", group=PARSERS, metavar="NAME",
        help="reasoning parser name, or auto",
    )  # fmt: skip
    default_chat_template_kwargs: Mapping[str, Any] = setting(
        attrs.Factory(dict), group=PARSERS,
        type=json_object, metavar="JSON",
        help='chat template variables for requests that do not set them, e.g. '
        '\'{"enable_thinking": false}\' (a request\'s own chat_template_kwargs win)',
    )  # fmt: skip
    thinking_token_budget: int | None = setting(
        None, group=PARSERS, type=non_negative_int, metavar="N",
        help="most reasoning tokens a request may write before the server closes its think "
        "block, for requests that set no budget of their own (default: no limit)",
    )  # fmt: skip
    enable_auto_tool_choice: bool = setting(
        False, group=PARSERS, action="store_true",
        help="accepted for vLLM's command lines; tool calls are always parsed when the model "
        "has a tool parser (--tool-call-parser), so it changes nothing",
    )  # fmt: skip
    tool_call_grammar: str = setting(
        "on", group=PARSERS, choices=("on", "off"),
        help="constrain tool calls to the model's own call format with valid arguments: "
        "under tool_choice auto from the call's opener to its closer, for required and "
        "named choices from the first token (off: auto unconstrained, forced choices as "
        "plain JSON)",
    )  # fmt: skip
    refuse_unrenderable_tools: bool = setting(
        False, group=PARSERS, action="store_true",
        help="answer 400 to a request with tools when the model's chat template cannot show "
        "tools to the model (default: serve it without them and log a warning)",
    )  # fmt: skip
    # -- http (serve) --------------------------------------------------------
    host: str = setting(
        "127.0.0.1", group=HTTP,
        help="address to listen on (default 127.0.0.1)",
    )  # fmt: skip
    port: int = setting(8000, group=HTTP, type=int, help="port to listen on (default 8000)")
    replica_name: str | None = setting(
        None, group=HTTP, metavar="NAME", type=header_value,
        help="name this server in an x-mlxcore-replica header on every response (to see "
        "which replica behind a router answered; default: no header)",
    )  # fmt: skip
    served_model_name: tuple[str, ...] = setting(
        (), group=HTTP, nargs="+", metavar="NAME", converter=tuple,
        help="model name(s) clients may use; the first is the one responses report "
        "(default: the model's name)",
    )  # fmt: skip
    accept_any_model_name: bool = setting(
        False, group=HTTP, action="store_true",
        help="serve requests whatever model name they give (agents ask for their vendor's "
        "names); responses report the name asked for",
    )  # fmt: skip
    extra_models: tuple[str, ...] = setting(
        None, group=HTTP, action="append", metavar="[NAME=]SOURCE", aliases=("--model",),
        converter=lambda v: tuple(v or ()),
        help="serve one more model (repeatable): a folder, repo id or .gguf file, under NAME "
        "(default: its own name); loaded on first use (see docs/models.md)",
    )  # fmt: skip
    models_config: str | None = setting(
        None, group=HTTP, metavar="FILE",
        help="a TOML file of models to serve: sources, aliases, plugins, pinning, idle "
        "timeouts, per-model flags (see docs/models.md)",
    )  # fmt: skip
    models_memory_budget: int | None = setting(
        None, group=HTTP, type=byte_size, metavar="SIZE",
        help="memory all loaded models' weights may take together; past it the least "
        "recently used idle model is unloaded (default: --gpu-memory-utilization of RAM)",
    )  # fmt: skip
    idle_unload: float = setting(
        0.0, group=HTTP, type=seconds, metavar="SECONDS",
        help="unload a model nobody used for this long (pinned ones stay; 0: never)",
    )  # fmt: skip
    responses_store_size: int = setting(
        64 * 1024 * 1024, group=HTTP, type=byte_size,
        metavar="SIZE",
        help="memory for stored Responses API responses (previous_response_id, GET); least "
        "recently used go first (default 64MiB; 0: store nothing)",
    )  # fmt: skip
    responses_ttl: float = setting(
        3600.0, group=HTTP, type=seconds, metavar="SECONDS",
        help="a stored response unused this long is forgotten (default 3600; 0: no limit)",
    )  # fmt: skip
    api_key: tuple[str, ...] = setting(
        None, group=HTTP, action="append", metavar="KEY",
        converter=lambda v: (v,) if isinstance(v, str) else tuple(v or ()),
        help="require this Bearer key on every route but /health and / (repeatable: any "
        "of them)",
    )  # fmt: skip
    api_keys_file: str | None = setting(
        None, group=HTTP, metavar="FILE",
        help="API keys as TOML [keys.NAME] tables, each a tenant with its role, cache group "
        "and limits (read again on SIGHUP); see docs/security.md",
    )  # fmt: skip
    metrics_access: str = setting(
        "keys", group=HTTP, choices=("keys", "admin", "public"),
        help="who may read /metrics and /metrics/history on a server with keys: any key, "
        "admin keys only, or anyone",
    )  # fmt: skip
    allowed_origins: tuple[str, ...] = setting(
        (), group=HTTP, nargs="+", metavar="ORIGIN", converter=tuple,
        help="enable CORS for these origins (off by default)",
    )  # fmt: skip
    max_request_body_bytes: int = setting(
        8 * 1024 * 1024, group=HTTP, type=positive_int,
        help="largest accepted request body",
    )  # fmt: skip
    shutdown_timeout: float = setting(
        20.0, group=HTTP, type=seconds, metavar="SECONDS",
        help="on SIGTERM, how long running requests may take to finish",
    )  # fmt: skip
    header_timeout: float = setting(
        30.0, group=HTTP, type=seconds, metavar="SECONDS",
        help="close a connection whose request head or body takes longer than this to arrive",
    )  # fmt: skip
    prepare_workers: int = setting(
        2, group=HTTP, type=positive_int, metavar="N",
        help="threads that template, tokenize and fetch media for new requests",
    )  # fmt: skip
    # -- distributed (docs/distributed.md) ---------------------------------------
    distributed: bool = setting(
        False, group=HTTP, action="store_true",
        help="serve one model split over the ranks of an mlx.distributed group (run on "
        "every rank, e.g. by `mlxcore launch`); rank 0 answers HTTP",
    )  # fmt: skip
    tensor_parallel: bool = setting(
        False, group=HTTP, action="store_true",
        help="with --distributed: split every layer's heads over the ranks (the default)",
    )  # fmt: skip
    pipeline_parallel: bool = setting(
        False, group=HTTP, action="store_true",
        help="with --distributed: give each rank a contiguous run of layers",
    )  # fmt: skip
    distributed_backend: str = setting(
        "ring", group=HTTP,
        choices=("ring", "jaccl", "mpi", "nccl"),
        help="mlx.distributed backend with --distributed (default ring: TCP)",
    )  # fmt: skip
    distributed_timeout: float = setting(
        20.0, group=HTTP, type=seconds, metavar="SECONDS",
        help="with --distributed: an engine step (or an idle pause) taking longer than this "
        "means a rank was lost: the requests fail, /health turns 503, the ranks exit 70",
    )  # fmt: skip
    plugin_options: Mapping[str, Any] = attrs.field(factory=dict)
    """Values of the flags plugins added, by argparse ``dest``."""

    def option(self, name: str, default: Any = None) -> Any:
        """A plugin option by its argparse ``dest`` name (``--my-flag`` -> ``my_flag``)."""
        return self.plugin_options.get(name, default)
