"""mlxcore plugin ``otel``: an OpenTelemetry trace for every request.

Off until ``--otlp-endpoint URL`` names an OTLP/HTTP collector (Jaeger, Tempo, the
OpenTelemetry Collector: ``http://host:4318``). Each finished generation becomes a
server span (``POST /v1/chat/completions``) under the caller's W3C ``traceparent`` when it
sent one, with four children on the request's own timeline: ``prepare`` (rendering and
tokenizing), ``queue`` (waiting for a slot), ``prefill`` (to the first token, with the
cached prompt tokens) and ``decode`` (to the end); attributes follow OpenTelemetry's
GenAI conventions (``gen_ai.usage.input_tokens``...). Spans are built from the core's
``mlxcore_request_finished`` record after the request ends, so tracing adds nothing to
the engine's steps; a background thread exports them in batches. See docs/operations.md.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.hookspecs import OptionGroup
from mlxcore.lifecycle import RequestRecord
from mlxcore.settings import add_flags, read_settings, setting


@attrs.frozen
class OtelSettings:
    """The otel plugin's settings; each default is stated here only."""

    otlp_endpoint: str | None = setting(
        None, metavar="URL",
        help="export a trace of every request to this OTLP/HTTP collector "
        "(http://host:4318, or the full .../v1/traces URL; default: no tracing)",
    )  # fmt: skip
    otlp_service_name: str = setting(
        "mlxcore", metavar="NAME", help="the service.name the traces carry",
    )  # fmt: skip


_tracing: list[Any] = []
"""The one :class:`~mlxcore_otel.spans.Tracing` of this process, once configured."""


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--otlp-endpoint`` and ``--otlp-service-name``."""
    add_flags(parser, OtelSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Start the exporter when an endpoint is given (once per process)."""
    settings = read_settings(config, OtelSettings)
    if settings.otlp_endpoint and not _tracing:
        from mlxcore_otel.spans import Tracing

        _tracing.append(Tracing.to_otlp(settings.otlp_endpoint, settings.otlp_service_name))


@hookimpl
def mlxcore_request_finished(record: RequestRecord) -> None:
    """The request's spans, handed to the exporter's thread."""
    if _tracing:
        _tracing[0].emit(record)
