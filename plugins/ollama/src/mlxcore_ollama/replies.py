"""What the Ollama routes answer, as JSON Schemas for the OpenAPI document (the bodies
built in :mod:`mlxcore_ollama.routes`, :mod:`mlxcore_ollama.embed` and
:mod:`mlxcore_ollama.models`). A streamed answer is NDJSON: one such object a line, the
last one with ``done`` true and the timings."""

from __future__ import annotations

from typing import Any

from mlxcore.server.openapi import (
    BOOLEAN,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    array,
    nullable,
    obj,
    reply,
)

NDJSON = "application/x-ndjson"
_TIMINGS = {
    "done_reason": {"enum": ["stop", "length", "load", "unload"]},
    "total_duration": INTEGER,
    "load_duration": INTEGER,
    "prompt_eval_count": INTEGER,
    "prompt_eval_duration": INTEGER,
    "eval_count": INTEGER,
    "eval_duration": INTEGER,
}
_LOGPROB = {"token": STRING, "logprob": NUMBER}
_LOGPROBS = array(obj(_LOGPROB, {"top_logprobs": array(obj(_LOGPROB))}))
_CALL = obj({"function": obj({"name": STRING, "arguments": OBJECT})})
CHAT = obj(
    {
        "model": STRING,
        "created_at": STRING,
        "message": obj(
            {"role": STRING, "content": STRING},
            {"thinking": STRING, "tool_calls": array(_CALL)},
        ),
        "done": BOOLEAN,
    },
    {**_TIMINGS, "logprobs": _LOGPROBS},
    title="OllamaChatResponse",
)
GENERATE = obj(
    {"model": STRING, "created_at": STRING, "response": STRING, "done": BOOLEAN},
    {"thinking": STRING, "logprobs": _LOGPROBS, **_TIMINGS},
    title="OllamaGenerateResponse",
)
EMBED = obj(
    {"model": STRING, "embeddings": array(array(NUMBER))},
    {"total_duration": INTEGER, "load_duration": INTEGER, "prompt_eval_count": INTEGER},
    title="OllamaEmbedResponse",
)
EMBEDDING = obj({"embedding": array(NUMBER)}, title="OllamaEmbeddingResponse")
DETAILS = obj(
    {
        "parent_model": STRING,
        "format": STRING,
        "family": STRING,
        "families": nullable(array(STRING)),
        "parameter_size": STRING,
        "quantization_level": STRING,
    }
)
_MODEL = {
    "name": STRING,
    "model": STRING,
    "modified_at": STRING,
    "size": INTEGER,
    "digest": STRING,
    "details": DETAILS,
}
TAGS = obj({"models": array(obj(_MODEL))}, title="OllamaTags")
RUNNING = obj(
    {
        "models": array(
            obj(
                {
                    **_MODEL,
                    "expires_at": STRING,
                    "size_vram": INTEGER,
                    "context_length": nullable(INTEGER),
                }
            )
        )
    },
    title="OllamaRunning",
)
SHOW = obj(
    {
        "modelfile": STRING,
        "parameters": STRING,
        "template": STRING,
        "details": DETAILS,
        "model_info": OBJECT,
        "capabilities": array(STRING),
        "modified_at": STRING,
    },
    title="OllamaShow",
)
VERSION = obj({"version": STRING}, title="OllamaVersion")
PROGRESS = obj(
    {"status": STRING},
    {"digest": STRING, "total": INTEGER, "completed": INTEGER},
    title="OllamaProgress",
)
STATUS = obj({"status": STRING}, title="OllamaStatus")


def streamed(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    """An answer that is one object, or (``stream``, the default) NDJSON lines of it."""
    documented = reply(description, schema)
    documented["content"][NDJSON] = {"schema": schema}
    return documented
