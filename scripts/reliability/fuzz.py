"""Property-based fuzzing of every route, generated from the server's own /openapi.json.

Bodies come from hypothesis: valid ones drawn from each route's JSON schema
(:func:`from_schema`, for the keywords msgspec's schemas use), valid ones with one
field replaced by arbitrary JSON or an extreme number, arbitrary JSON documents, raw
bytes and wrong content types; plus unknown paths and methods. Every response must be
below 500 (503 only with Retry-After), errors must be in their API's shape, and streams
must be well formed.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
from common import auth, error_shape_problem, retry_problem, stream_problem
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
OLLAMA_ROUTES = ("/api/chat", "/api/generate")
CAPPED_LIMIT = 256
"""The longest generation budget the fuzz keeps: the document allows budgets up to the
context (and /v1/messages caps any max_tokens at the context), legitimately long
generations, not faults, so drawn budgets are cut to this many tokens to finish in
minutes."""
EXTREMES = [0, -1, 1, 2**31, 2**63, 2**64, -(2**63), 1e308, -1e308, 1e-300, 0.5, 3, 100000]
NUMERIC_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "top_logprobs",
    "logprobs",
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def from_schema(schema: Any, components: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values valid for ``schema`` (the JSON-schema keywords msgspec emits: ``$ref``,
    ``anyOf``, ``type`` object / array / string / integer / number / boolean / null,
    ``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``)."""
    if depth > 6:
        return st.none()
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_schema(components[name], components, depth + 1))
    if "anyOf" in schema:
        return st.one_of([from_schema(s, components, depth + 1) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, components, depth) for k in kind])
    if kind == "object":
        props = schema.get("properties")
        if props is None:
            return st.dictionaries(st.text(max_size=10), json_values, max_size=4)
        required = set(schema.get("required", ()))
        fields = {k: from_schema(v, components, depth + 1) for k, v in props.items()}
        return st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required},
            optional={k: v for k, v in fields.items() if k not in required},
        )
    if kind == "array":
        items = from_schema(schema.get("items", {}), components, depth + 1)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=3)
    simple: dict[str, st.SearchStrategy[Any]] = {
        "string": st.text(max_size=30),
        "integer": st.integers(min_value=-(2**64), max_value=2**64),
        "number": st.floats(allow_nan=False, allow_infinity=False),
        "boolean": st.booleans(),
        "null": st.none(),
    }
    return simple.get(kind, json_values) if isinstance(kind, str) else json_values


def collect(strategy: st.SearchStrategy[Any], n: int, seed: int) -> list[Any]:
    """``n`` examples drawn from ``strategy`` (deterministic for ``seed``)."""
    out: list[Any] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(strategy)
    def gather(value: Any) -> None:
        out.append(value)

    random.seed(seed)
    gather()
    return out


def body_strategies(document: dict[str, Any]) -> dict[str, st.SearchStrategy[Any]]:
    """Path -> strategy of valid bodies, for every route with a JSON body (uploads,
    ``multipart/form-data``, are fuzzed by their plugins' own tests)."""
    components = document["components"]["schemas"]
    out: dict[str, st.SearchStrategy[Any]] = {}
    for path, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody")
        if body is None or "application/json" not in body["content"]:
            continue
        out[path] = from_schema(body["content"]["application/json"]["schema"], components)
    return out


ROLES = {
    "/v1/chat/completions": ["system", "user", "assistant", "tool"],
    "/api/chat": ["system", "user", "assistant", "tool"],
    "/v1/messages": ["user", "assistant"],
}


def _plausible(path: str, body: Any, rng: random.Random, served: str) -> Any:
    """Most schema-valid bodies get a served model name and sensible messages, so the
    fuzz reaches sampling, templating and generation instead of stopping at the first
    semantic check; the rest keep whatever was drawn. (The OpenAI and Anthropic routes
    take no name as the default model; Ollama's need one: ``served``.)"""
    if not isinstance(body, dict) or rng.random() < 0.3:
        return body
    body = {k: v for k, v in body.items() if k != "model"}
    if path.startswith("/api/"):
        body["model"] = served
    if path in ROLES and isinstance(body.get("messages"), list):
        messages = []
        for m in body["messages"][:3] or [{}]:
            text = m.get("content") if isinstance(m, dict) else None
            content = text if isinstance(text, str) and text else rng.choice(["hi", "Say a word."])
            messages.append({"role": "user", "content": content})
        if rng.random() < 0.3:
            messages.insert(0, {"role": rng.choice(ROLES[path]), "content": "be brief"})
        body["messages"] = messages
    for key in ("tools", "tool_choice", "response_format", "system", "thinking"):
        if key in body and rng.random() < 0.5:
            del body[key]
    return body


def _bounded(path: str, body: Any, rng: random.Random) -> Any:
    """Keep generations short: most valid bodies get a small max_tokens (the rest keep
    whatever was drawn), so 2,000 requests finish in minutes on a CPU."""
    if isinstance(body, dict) and path in OLLAMA_ROUTES:  # the budget is an option
        options = body.get("options")
        options = dict(options) if isinstance(options, dict) else {}
        options["num_predict"] = rng.randint(1, 16)
        return {**body, "options": options}
    if not isinstance(body, dict) or path not in GENERATION_ROUTES:
        return body
    field = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body = {**body, "n": 2}  # 16 choices of 256 tokens each: minutes behind a queue
    if rng.random() < 0.8:
        body = {**body, field: rng.randint(1, 16)}
        body.pop("max_completion_tokens", None)
    else:  # the schema bounds budgets by the context only: a valid 8,000 would take hours
        for name in (field, "max_completion_tokens", "min_tokens"):
            if isinstance(body.get(name), int):
                body = {**body, name: min(body[name], CAPPED_LIMIT)}
        if path != "/v1/messages" and all(
            body.get(name) is None for name in (field, "max_completion_tokens")
        ):  # no budget (absent or null): the server's default (512) queued behind
            body = {**body, field: CAPPED_LIMIT}  # others ran past 300 s
    return body


def cases(
    document: dict[str, Any], total: int, seed: int, served: str = ""
) -> list[dict[str, Any]]:
    """About ``total`` requests: ``{method, path, content (bytes), headers}``
    (``served``: the server's model name, for routes that need one)."""
    rng = random.Random(seed)
    bodies = body_strategies(document)
    share = max(1, (total * 7 // 10) // max(1, len(bodies)))
    out: list[dict[str, Any]] = []
    replacements = EXTREMES + collect(json_values, 200, seed + 3)

    def add(path: str, payload: Any, method: str = "POST", kind: str = "application/json") -> None:
        if isinstance(payload, bytes):
            content = payload
        else:
            content = json.dumps(payload, allow_nan=False).encode()
        out.append({"method": method, "path": path, "content": content, "type": kind})

    for path, strategy in bodies.items():
        valid = collect(strategy, share, seed)
        for body in valid:
            if rng.random() < 0.35 and isinstance(body, dict):
                field = rng.choice([*body.keys(), *NUMERIC_FIELDS])
                body = {**body, field: rng.choice(replacements)}
            add(path, _bounded(path, _plausible(path, body, rng, served), rng))
    paths = list(bodies)
    for value in collect(json_values, total // 10, seed + 1):
        add(rng.choice(paths), value)
    for raw in collect(st.binary(max_size=64), total // 20, seed + 2):
        add(rng.choice(paths), raw)
    for _ in range(total // 20):
        add(
            rng.choice(paths), b'{"model": "x"}', kind=rng.choice(["text/plain", "application/xml"])
        )
    others = ["/v1/models", "/health", "/metrics", "/openapi.json", "/docs", "/v1/nope", "/"]
    for _ in range(total // 20):
        method = rng.choice(["GET", "GET", "DELETE", "PUT", "PATCH", "POST"])
        add(rng.choice(others + paths), b"", method=method)
    while len(out) < total:
        add(rng.choice(paths), {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    rng.shuffle(out)
    return out


async def send_all(
    base: str, requests: list[dict[str, Any]], concurrency: int
) -> tuple[dict[int, int], list[str]]:
    """Send ``requests``; return status counts and every problem found."""
    statuses: dict[int, int] = {}
    problems: list[str] = []
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for req in requests:
        queue.put_nowait(req)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, auth=auth(), timeout=300, limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                try:
                    problem, status = await _one(client, req)
                except httpx.HTTPError as exc:
                    where = f"{req['method']} {req['path']} {req['content'][:400]!r}"
                    problems.append(f"{where}: {type(exc).__name__} {exc}")
                    continue
                statuses[status] = statuses.get(status, 0) + 1
                if problem:
                    problems.append(
                        f"{req['method']} {req['path']} {req['content'][:200]!r}: {problem}"
                    )

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses, problems


NEVER_STREAMED = ("/render",)
"""Routes whose answer is JSON whatever ``stream`` says: vLLM's render API takes the
generation's whole body and echoes ``stream`` (the document gives them no event stream)."""


async def _one(client: httpx.AsyncClient, req: dict[str, Any]) -> tuple[str | None, int]:
    headers = {"content-type": req["type"]}
    path = req["path"]
    async with client.stream(
        req["method"], req["path"], content=req["content"], headers=headers
    ) as r:
        text = (await r.aread()).decode("utf-8", errors="replace")
    if r.status_code >= 500 and r.status_code != 503:
        return f"HTTP {r.status_code}: {text[:200]}", r.status_code
    if r.status_code >= 400:
        problem = retry_problem(r)
        if path.startswith(("/v1/", "/api/")):
            problem = problem or error_shape_problem(path, r)
        return problem, r.status_code
    kind = r.headers.get("content-type", "")
    if kind.startswith(("text/event-stream", "application/x-ndjson")) or (
        b'"stream": true' in req["content"] and not path.endswith(NEVER_STREAMED)
    ):
        return stream_problem(path, r, text), r.status_code
    return None, r.status_code
