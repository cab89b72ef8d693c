"""Tool calls constrained in each model's own format (issue 57, decision 0023), through
real servers and the official ``openai`` client, on random-weight test models.

Under ``tool_choice: auto`` with a ``logit_bias`` that makes the call opener likely,
every returned call parses and validates against its tool's schema; ``required`` and
named choices come back through the model's own parser; streamed calls equal the
non-streamed ones; ``--tool-call-grammar off`` keeps the old behaviour; and greedy
output before the first opener is token for token what it is without the grammar
(in process, through the real request builder). ``scripts/tool_call_grammar.py`` runs
the same cases 100 times per family.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlxcore.engine.request import SamplingParams
from mlxcore.request_builder import ChatPrompt, RequestSpec, build_generations
from mlxcore.testing.models import build_test_model
from mlxcore.testing.runtime import make_runtime, submit_together
from mlxcore.testing.server import Server, ServerFactory
from mlxcore.testing.tool_call_cases import FAMILIES, MESSAGES, TOOLS, check_calls

pytestmark = pytest.mark.timeout(600)

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
NAMED = {"type": "function", "function": {"name": "create_event"}}


@pytest.fixture(scope="module")
def servers(mlxcore_server: ServerFactory) -> dict[str, Server]:
    out = {}
    for name, family in FAMILIES.items():
        flags = ["--served-model-name", "m"]
        for plugin in family.plugins:
            flags += ["--plugin", plugin]
        out[name] = mlxcore_server(build_test_model(family.arch), *flags)
    return out


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=300)


def _bias(server: Server, opener: str, value: float = 12) -> dict[str, float]:
    r = httpx.post(
        f"{server.base_url}/tokenize", json={"prompt": opener, "add_special_tokens": False}
    )
    (token,) = r.json()["tokens"]
    return {str(token): value}


def _ask(server: Server, opener: str, **kwargs: Any) -> Any:
    return _client(server).chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        logit_bias=_bias(server, opener),  # type: ignore[arg-type]
        extra_body=NO_THINKING,
        **{"max_tokens": 160, "temperature": 1.0, **kwargs},
    )


def _calls(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


@pytest.mark.parametrize("parser", list(FAMILIES))
def test_auto_calls_always_validate(servers: dict[str, Server], parser: str) -> None:
    family = FAMILIES[parser]
    with_call = 0
    for seed in range(4):
        r = _ask(servers[parser], family.opener, seed=seed)
        checked = check_calls(_calls(r.choices[0].message))
        assert not checked.invalid, checked.invalid
        with_call += checked.whole > 0
    assert with_call >= 3


@pytest.mark.parametrize("parser", list(FAMILIES))
def test_forced_choices_use_the_models_own_format(servers: dict[str, Server], parser: str) -> None:
    family = FAMILIES[parser]
    r = _ask(servers[parser], family.opener, seed=1, tool_choice="required")
    message = r.choices[0].message
    checked = check_calls(_calls(message))
    assert checked.whole >= 1 and not checked.invalid, checked.invalid
    # calls until max_tokens: only a last call cut short may come back as text
    assert not message.content or message.content.startswith(family.opener)
    r = _ask(
        servers[parser], family.opener, seed=1, tool_choice="required", parallel_tool_calls=False
    )
    calls = _calls(r.choices[0].message)
    assert len(calls) == 1 and not check_calls(calls).invalid
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    r = _ask(servers[parser], family.opener, seed=2, tool_choice=NAMED)
    calls = _calls(r.choices[0].message)
    assert [c[0] for c in calls] == ["create_event"]
    assert not check_calls(calls).invalid
    assert r.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("parser", ["hermes", "qwen3_coder"])
def test_streamed_calls_equal_the_whole_ones(servers: dict[str, Server], parser: str) -> None:
    family = FAMILIES[parser]
    one = {"seed": 3, "parallel_tool_calls": False}  # no last call cut by max_tokens
    whole = _calls(_ask(servers[parser], family.opener, **one).choices[0].message)
    assert whole
    parts: dict[int, dict[str, str]] = {}
    for chunk in _ask(servers[parser], family.opener, stream=True, **one):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            slot = parts.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function and delta.function.name:
                slot["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                slot["arguments"] += delta.function.arguments
    streamed = [(p["name"], p["arguments"]) for _, p in sorted(parts.items())]
    assert [(n, json.loads(a)) for n, a in streamed] == [(n, json.loads(a)) for n, a in whole]


def test_grammar_off_keeps_the_old_behaviour(
    mlxcore_server: ServerFactory, tiny_qwen3: Path
) -> None:
    server = mlxcore_server(tiny_qwen3, "--served-model-name", "m", "--tool-call-grammar", "off")
    for seed in range(3):  # the opener repeats and stays text
        r = _ask(server, "<tool_call>", seed=seed)
        assert not _calls(r.choices[0].message)
        assert "<tool_call>" in (r.choices[0].message.content or "")
    r = _ask(server, "<tool_call>", seed=0, tool_choice=NAMED)  # plain JSON, still a call
    calls = _calls(r.choices[0].message)
    assert [c[0] for c in calls] == ["create_event"] and not check_calls(calls).invalid


def test_a_schema_the_format_cannot_express_runs_unconstrained(
    servers: dict[str, Server],
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "string", "pattern": "^[a-z]+$"}},
            },
        },
    }
    server = servers["qwen3_coder"]
    r = _client(server).chat.completions.create(
        model="m",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[tool],  # type: ignore[list-item]
        max_tokens=12,
        temperature=1.0,
        seed=0,
        logit_bias=_bias(server, "<tool_call>"),  # type: ignore[arg-type]
        extra_body=NO_THINKING,
    )
    # unconstrained: the biased opener repeats as text (inside a call it would be masked)
    assert (r.choices[0].message.content or "").count("<tool_call>") >= 2


def _greedy_pair(parser: str, seed: int, biases: tuple[float, ...]) -> int:
    """Greedy on and off for each bias; asserts the same tokens up to the first opener
    and returns in how many runs text came before it."""
    family = FAMILIES[parser]
    model = build_test_model(family.arch, seed=seed)
    runtimes = {g: make_runtime(model, *family.plugins, tool_call_grammar=g) for g in ("on", "off")}
    text_first = 0
    try:
        (opener,) = runtimes["on"].tokenizer.encode(family.opener, add_special_tokens=False)
        for bias in biases:
            out = {}
            for grammar, rt in runtimes.items():
                spec = RequestSpec(
                    prompt=ChatPrompt(list(MESSAGES), list(TOOLS), {"enable_thinking": False}),
                    sampling=SamplingParams(
                        temperature=0.0, logit_bias={opener: bias}, frequency_penalty=1.5
                    ),
                    new_id=lambda: "x",
                    max_tokens=40,
                )
                (generation,) = build_generations(rt, spec)
                (result,) = submit_together(rt, [generation.request])
                out[grammar] = result.tokens
            at = out["off"].index(opener) if opener in out["off"] else len(out["off"])
            assert out["on"][:at] == out["off"][:at], (seed, bias)
            if 0 < at < len(out["off"]):
                assert out["on"][at] == opener and out["on"][at + 1 :] != out["off"][at + 1 :]
                text_first += 1
    finally:
        for rt in runtimes.values():
            rt.engine.shutdown()
    return text_first


@pytest.mark.parametrize("parser", list(FAMILIES))
def test_greedy_text_before_the_opener_is_unchanged(parser: str) -> None:
    """Greedy with the grammar on and off: the same tokens up to the first opener. A
    frequency penalty moves the output along until the biased opener wins; some bias
    and model seed tried must put text before it."""
    biases = (2.0, 3.0, 4.0, 5.0)
    assert any(_greedy_pair(parser, seed, biases) for seed in (0, 1))


def test_anthropic_tool_choice_uses_the_models_own_format(servers: dict[str, Server]) -> None:
    import anthropic

    server = servers["qwen3_coder"]
    client = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0)
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]
    message = client.messages.create(
        model="m",
        max_tokens=300,
        messages=[{"role": "user", "content": MESSAGES[0]["content"]}],
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "tool", "name": "create_event"},
    )
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["create_event"]
    assert not check_calls([(u.name, json.dumps(u.input)) for u in uses]).invalid
    assert message.stop_reason == "tool_use"


def test_top_logprobs_inside_a_call_are_finite(servers: dict[str, Server]) -> None:
    """Inside a call the grammar rules most tokens out: their logprob is reported as
    -9999.0 (OpenAI's and vLLM's value), never -inf (not JSON: it came back as null)."""
    family = FAMILIES["hermes"]
    raw = httpx.post(
        f"{servers['hermes'].v1}/chat/completions",
        json={
            "model": "m", "messages": MESSAGES, "tools": TOOLS, "temperature": 1.0, "seed": 4,
            "max_tokens": 160, "logit_bias": _bias(servers["hermes"], family.opener),
            "parallel_tool_calls": False, "logprobs": True, "top_logprobs": 3, **NO_THINKING,
        },
        timeout=300,
    ).json()  # fmt: skip
    tops = [
        t["logprob"] for c in raw["choices"][0]["logprobs"]["content"] for t in c["top_logprobs"]
    ]
    assert tops and all(isinstance(v, float) for v in tops)
    assert -9999.0 in tops


def test_speculative_decoding_keeps_the_calls(
    servers: dict[str, Server], mlxcore_server: ServerFactory, tiny_qwen3_5: Path
) -> None:
    """Qwen3.5 with its MTP head drafting: drafts the grammar rules out are rolled back,
    so a greedy call is the plain decoder's, and sampled calls all validate."""
    mtp = mlxcore_server(tiny_qwen3_5, "--served-model-name", "m", "--plugin", "qwen35-mtp")
    family = FAMILIES["qwen3_coder"]
    greedy = {"seed": 0, "tool_choice": NAMED, "temperature": 0.0}
    plain = _calls(_ask(servers["qwen3_coder"], family.opener, **greedy).choices[0].message)
    drafted = _calls(_ask(mtp, family.opener, **greedy).choices[0].message)
    assert plain and [(n, json.loads(a)) for n, a in drafted] == [
        (n, json.loads(a)) for n, a in plain
    ]
    for seed in range(2):
        checked = check_calls(_calls(_ask(mtp, family.opener, seed=seed).choices[0].message))
        assert checked.whole >= 1 and not checked.invalid, checked.invalid
