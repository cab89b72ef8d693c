"""A finished request's record as OpenTelemetry spans.

One server span for the request (its parent: the caller's ``traceparent`` when given)
and a child per step of its life: ``prepare`` (arrival to the engine's queue: rendering
and tokenizing), ``queue`` (to admission), ``prefill`` (to the first token) and
``decode`` (to the end); under ``prefill``, a ``prefill.chunk`` span per piece of prefill
work the engine did for it (``mlxcore.tokens`` computed, ``mlxcore.cached_tokens`` reused
from the prefix cache; a short prompt prefilled with others is one); on ``decode``, the
engine's decode steps for it (``mlxcore.decode_steps``, ``mlxcore.decode_tokens``,
``mlxcore.decode_multi_token_steps``: a speculative decoder's rounds that accepted
drafts). Steps a request never reached (cancelled in the queue, failed in the prefill)
have no span. Times are the record's own, so the spans line up with the usage the client
was given.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from mlxcore.lifecycle import RequestRecord

EXPORT_DELAY_MS = 500
"""How long spans wait to be exported in a batch."""


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (or the URL itself)."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


def attributes(record: RequestRecord) -> dict[str, Any]:
    """The request span's attributes (GenAI and HTTP conventions, then mlxcore's own)."""
    out: dict[str, Any] = {
        "gen_ai.operation.name": "chat" if "chat" in record.path else "text_completion",
        "gen_ai.request.model": record.model,
        "gen_ai.response.id": record.request_id,
        "gen_ai.response.finish_reasons": [record.finish_reason],
        "gen_ai.usage.input_tokens": record.prompt_tokens,
        "gen_ai.usage.output_tokens": record.completion_tokens,
        "mlxcore.cached_tokens": record.cached_tokens,
        "mlxcore.http_request_id": record.http_request_id,
    }
    if record.method:
        out["http.request.method"] = record.method
        out["url.path"] = record.path
    for key, value in record.extra.items():
        if isinstance(value, bool | int | float | str):
            out[f"mlxcore.{key}"] = value
    own = record.extra.get("mlxcore")
    cache = own.get("cache") if isinstance(own, dict) else None
    if isinstance(cache, dict):  # why the prefix cache did or did not hit
        for key, value in cache.items():
            if isinstance(value, bool | int | float | str):
                out[f"mlxcore.cache.{key}"] = value
    return out


def decode_figures(record: RequestRecord) -> dict[str, Any]:
    """The decode span's step figures: how many decode steps gave the request tokens, and
    of those how many gave more than one (speculative rounds with accepted drafts)."""
    for step in record.steps:
        if step.name == "decode":
            return {f"mlxcore.decode_{key}": value for key, value in step.figures.items()}
    return {}


class Tracing:
    """Turns records into spans on its own tracer provider (the process's global one
    is left alone)."""

    def __init__(self, processor: SpanProcessor, service_name: str = "mlxcore") -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("mlxcore")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def to_otlp(cls, endpoint: str, service_name: str) -> Tracing:
        """Export over OTLP/HTTP (protobuf) in batches, from a background thread."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter: SpanExporter = OTLPSpanExporter(endpoint=traces_url(endpoint))
        return cls(
            BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MS), service_name
        )

    def emit(self, record: RequestRecord) -> None:
        """The request's spans, ended at their recorded times."""
        parent = None
        if record.traceparent:
            carrier = {"traceparent": record.traceparent}
            if record.tracestate:
                carrier["tracestate"] = record.tracestate
            parent = self.propagator.extract(carrier)
        name = f"{record.method} {record.path}" if record.method else "generation"
        root = self.tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=record.received_ns,
            attributes=attributes(record),
        )
        inside = trace.set_span_in_context(root)
        steps = [
            ("prepare", record.received_ns, record.submitted_ns, {}),
            ("queue", record.submitted_ns, record.admitted_ns, {}),
            (
                "prefill",
                record.admitted_ns,
                record.first_token_ns,
                {
                    "gen_ai.usage.input_tokens": record.prompt_tokens,
                    "mlxcore.cached_tokens": record.cached_tokens,
                },
            ),
            (
                "decode",
                record.first_token_ns,
                record.finished_ns if record.first_token_ns is not None else None,
                {"gen_ai.usage.output_tokens": record.completion_tokens},
            ),
        ]
        for step, start, end, extra in steps:
            if start is None or end is None:
                continue
            span = self.tracer.start_span(step, context=inside, start_time=start, attributes=extra)
            if step == "prefill":
                self._engine_steps(record, trace.set_span_in_context(span))
            if step == "decode":
                span.set_attributes(decode_figures(record))
            span.end(end_time=max(start, end))
        if record.finish_reason == "error":
            root.set_status(Status(StatusCode.ERROR, "generation failed"))
        root.end(end_time=record.finished_ns)

    def _engine_steps(self, record: RequestRecord, inside: Any) -> None:
        """The engine's timed work (each prefill chunk) as spans under ``inside``."""
        chunks = [step for step in record.steps if step.name == "prefill_chunk"]
        for index, step in enumerate(chunks):
            attributes = {f"mlxcore.{key}": value for key, value in step.figures.items()}
            attributes["mlxcore.index"] = index
            span = self.tracer.start_span(
                "prefill.chunk",
                context=inside,
                start_time=step.start_ns,
                attributes=attributes,
            )
            span.end(end_time=max(step.start_ns, step.end_ns))

    def shutdown(self) -> None:
        """Export what is left and stop."""
        self.provider.shutdown()
