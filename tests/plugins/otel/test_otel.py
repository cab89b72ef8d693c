"""The otel plugin: a finished request's record as spans (the SDK's in-memory exporter),
and traces from a real server to a real OTLP/HTTP receiver, under the caller's
``traceparent``, one trace per request, timings consistent with the usage (the records
come from the core's ``mlxcore_request_finished`` hook)."""

from __future__ import annotations

import http.server
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mlxcore.engine.events import EngineStep
from mlxcore.lifecycle import RequestRecord
from mlxcore.testing.server import Server, ServerFactory
from mlxcore_otel.spans import Tracing, traces_url

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CALLER}-01"


def record(**changes: Any) -> RequestRecord:
    base: dict[str, Any] = dict(
        request_id="chatcmpl-1",
        http_request_id="rid-1",
        method="POST",
        path="/v1/chat/completions",
        traceparent=TRACEPARENT,
        tracestate=None,
        model="tiny",
        received_ns=1_000,
        submitted_ns=2_000,
        admitted_ns=5_000,
        first_token_ns=9_000,
        finished_ns=20_000,
        finish_reason="stop",
        prompt_tokens=12,
        cached_tokens=8,
        completion_tokens=5,
        extra={"speculative_acceptance": 0.5, "mlxcore": {"cache": {"outcome": "hit"}}},
    )
    return RequestRecord(**(base | changes))


def spans_of(rec: RequestRecord) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    Tracing(SimpleSpanProcessor(exporter)).emit(rec)
    return {s.name: s for s in exporter.get_finished_spans()}


def test_a_record_becomes_a_request_span_and_its_steps() -> None:
    spans = spans_of(record())
    root = spans["POST /v1/chat/completions"]
    assert set(spans) == {root.name, "prepare", "queue", "prefill", "decode"}
    assert f"{root.context.trace_id:032x}" == TRACE
    assert f"{root.parent.span_id:016x}" == CALLER  # under the caller's span
    assert (root.start_time, root.end_time) == (1_000, 20_000)
    steps = [
        (spans[n].start_time, spans[n].end_time) for n in ("prepare", "queue", "prefill", "decode")
    ]
    assert steps == [(1_000, 2_000), (2_000, 5_000), (5_000, 9_000), (9_000, 20_000)]
    for name in ("prepare", "queue", "prefill", "decode"):
        assert spans[name].parent.span_id == root.context.span_id
    attrs = root.attributes
    assert attrs["gen_ai.usage.input_tokens"] == 12 and attrs["gen_ai.usage.output_tokens"] == 5
    assert attrs["mlxcore.cached_tokens"] == 8 and attrs["mlxcore.http_request_id"] == "rid-1"
    assert attrs["mlxcore.speculative_acceptance"] == 0.5
    assert attrs["mlxcore.cache.outcome"] == "hit"
    assert spans["prefill"].attributes["mlxcore.cached_tokens"] == 8


def test_prefill_chunks_are_spans_under_the_prefill() -> None:
    chunks = (
        EngineStep("prefill_chunk", 5_000, 6_500, {"tokens": 2, "cached_tokens": 8}),
        EngineStep("prefill_chunk", 6_600, 8_800, {"tokens": 2, "cached_tokens": 8}),
    )
    exporter = InMemorySpanExporter()
    Tracing(SimpleSpanProcessor(exporter)).emit(record(steps=chunks))
    spans = exporter.get_finished_spans()
    prefill = next(s for s in spans if s.name == "prefill")
    found = sorted((s for s in spans if s.name == "prefill.chunk"), key=lambda s: s.start_time)
    assert [(s.start_time, s.end_time) for s in found] == [(5_000, 6_500), (6_600, 8_800)]
    assert all(s.parent.span_id == prefill.context.span_id for s in found)
    assert [s.attributes["mlxcore.tokens"] for s in found] == [2, 2]
    assert [s.attributes["mlxcore.index"] for s in found] == [0, 1]
    assert found[0].attributes["mlxcore.cached_tokens"] == 8


def test_steps_never_reached_have_no_span_and_errors_are_marked() -> None:
    queued = spans_of(record(admitted_ns=None, first_token_ns=None, finish_reason="cancelled"))
    assert set(queued) == {"POST /v1/chat/completions", "prepare"}
    failed = spans_of(record(first_token_ns=None, finish_reason="error", traceparent=None))
    root = failed["POST /v1/chat/completions"]
    assert set(failed) == {root.name, "prepare", "queue"}
    assert root.status.status_code.name == "ERROR" and root.parent is None


def test_traces_url() -> None:
    assert traces_url("http://h:4318") == "http://h:4318/v1/traces"
    assert traces_url("http://h:4318/v1/traces/") == "http://h:4318/v1/traces"


class Receiver(http.server.BaseHTTPRequestHandler):
    """A minimal OTLP/HTTP traces endpoint (protobuf), keeping every span it is sent."""

    spans: list[Any] = []
    paths: list[str] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        Receiver.paths.append(self.path)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                Receiver.spans.extend(scope.spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3: Path, receiver: str) -> Server:
    return mlxcore_server(tiny_qwen3, "--served-model-name", "tiny", "--otlp-endpoint", receiver)


@pytest.mark.e2e
def test_a_real_server_exports_one_trace_per_request(server: Server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    answers = {}
    for i, headers in enumerate(
        [{"traceparent": TRACEPARENT, "x-request-id": "traced-0"}, {"x-request-id": "traced-1"}]
    ):
        answers[f"traced-{i}"] = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"trace me {i}"}],
            max_tokens=6,
            extra_headers=headers,
        )
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "streamed"}],
        max_tokens=6,
        stream=True,
        extra_headers={"x-request-id": "traced-2"},
    )
    assert [c for c in stream]
    deadline = time.monotonic() + 20
    roots: dict[str, Any] = {}
    while len(roots) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
        for span in list(Receiver.spans):
            for a in span.attributes:
                if a.key == "mlxcore.http_request_id":
                    roots[a.value.string_value] = span
    assert set(roots) == {"traced-0", "traced-1", "traced-2"}
    assert set(Receiver.paths) == {"/v1/traces"}
    # one trace per request; the first under the caller's traceparent
    assert len({r.trace_id for r in roots.values()}) == 3
    assert roots["traced-0"].trace_id.hex() == TRACE
    assert roots["traced-0"].parent_span_id.hex() == CALLER
    assert roots["traced-1"].parent_span_id == b""
    for rid, root in roots.items():
        children = {
            s.name: s
            for s in Receiver.spans
            if s.trace_id == root.trace_id and s.parent_span_id == root.span_id
        }
        assert set(children) == {"prepare", "queue", "prefill", "decode"}, rid
        chunks = [
            s
            for s in Receiver.spans
            if s.trace_id == root.trace_id and s.parent_span_id == children["prefill"].span_id
        ]
        assert chunks and {s.name for s in chunks} == {"prefill.chunk"}, rid
        figures = [{a.key: a.value.int_value for a in s.attributes} for s in chunks]
        computed = sum(f["mlxcore.tokens"] for f in figures)
        reused = figures[0]["mlxcore.cached_tokens"]
        input_tokens = next(a for a in root.attributes if a.key == "gen_ai.usage.input_tokens")
        assert computed + reused == input_tokens.value.int_value, rid
        order = [children[n] for n in ("prepare", "queue", "prefill", "decode")]
        assert order[0].start_time_unix_nano == root.start_time_unix_nano
        assert order[-1].end_time_unix_nano == root.end_time_unix_nano
        for before, after in itertools.pairwise(order):
            assert before.end_time_unix_nano == after.start_time_unix_nano
        values = {a.key: a.value for a in root.attributes}
        assert values["url.path"].string_value == "/v1/chat/completions"
        if rid in answers:  # the span's usage is the one the client got
            usage = answers[rid].usage
            assert values["gen_ai.usage.input_tokens"].int_value == usage.prompt_tokens
            assert values["gen_ai.usage.output_tokens"].int_value == usage.completion_tokens
            assert values["gen_ai.response.id"].string_value == answers[rid].id
            decode = {a.key: a.value.int_value for a in children["decode"].attributes}
            assert decode["mlxcore.decode_tokens"] == usage.completion_tokens - 1  # 1: prefill
            assert 1 <= decode["mlxcore.decode_steps"] <= decode["mlxcore.decode_tokens"]
