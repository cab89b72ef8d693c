"""Generation controls over HTTP: exact continuation text, vLLM's tokenizer routes.

The scripted test plugin makes the model write a known text, so what the server must
return is known to the character."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3: Path) -> Any:
    from mlxcore.models.loader import load_model

    return load_model(tiny_qwen3).tokenizer


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=60)


# -- exact text ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_completion_text_keeps_the_first_token_s_leading_space(
    client: openai.OpenAI, tokenizer: Any, stream: bool
) -> None:
    prompt, script = "The capital of France is", " Paris, of course."
    answer = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=20, temperature=0, stream=stream,
        extra_body={"test_script": script},
    )  # fmt: skip
    chunks = list(answer) if stream else [answer]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == script
    ids = tokenizer.encode(prompt) + tokenizer.encode(script, add_special_tokens=False)
    assert prompt + text == tokenizer.decode(ids)


def test_chat_content_is_the_exact_continuation_too(client: openai.OpenAI) -> None:
    for stream in (False, True):
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20,
            stream=stream, extra_body={"test_script": " leading space"},
        )  # fmt: skip
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        else:
            text = answer.choices[0].message.content
        assert text == " leading space", stream


# -- /tokenize and /detokenize ---------------------------------------------------------


def test_tokenize_a_prompt_as_completions_would(scripted_server: Server, tokenizer: Any) -> None:
    text = "Grüße, 東京!"
    got = post(scripted_server, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert got["tokens"] == tokenizer.encode(text)
    assert got["count"] == len(got["tokens"])
    assert got["token_strs"] == tokenizer.convert_ids_to_tokens(got["tokens"])
    assert isinstance(got["max_model_len"], int)
    plain = post(scripted_server, "/tokenize", {"content": text}).json()  # llama-server's name
    assert plain["tokens"] == got["tokens"] and plain["token_strs"] is None
    back = post(scripted_server, "/detokenize", {"tokens": got["tokens"]}).json()
    assert back["prompt"] == text == back["content"]


def test_tokenize_messages_counts_what_chat_completions_reports(
    scripted_server: Server, client: openai.OpenAI
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    got = post(scripted_server, "/tokenize", {"messages": messages, "model": "tiny"}).json()
    chat = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=3,
        extra_body={"test_script": "ok"},  # type: ignore[arg-type]
    )
    assert chat.usage is not None and got["count"] == chat.usage.prompt_tokens
    open_turn = post(
        scripted_server, "/tokenize", {"messages": messages, "add_generation_prompt": False}
    ).json()
    assert 0 < open_turn["count"] < got["count"]
    assert got["tokens"][: open_turn["count"]] == open_turn["tokens"]


def test_render_gives_the_ids_a_chat_request_with_tools_prefills(
    scripted_server: Server, client: openai.OpenAI
) -> None:
    """vLLM's render API, as vllm-router calls it for a request with tools: the whole
    chat body in, ``token_ids`` out, the ids ``/tokenize`` gives and as many as the
    generation's ``prompt_tokens``; completions render each prompt."""
    from tool_definitions import TIME

    messages = [{"role": "user", "content": "What time is it in UTC?"}]
    body = {"model": "tiny", "messages": messages, "tools": [TIME], "max_tokens": 3}
    rendered = post(scripted_server, "/v1/chat/completions/render", body).json()
    tokenized = post(scripted_server, "/tokenize", {"messages": messages, "tools": [TIME]})
    assert rendered["token_ids"] == tokenized.json()["tokens"]
    assert rendered["model"] == "tiny" and rendered["features"] is None
    chat = client.chat.completions.create(
        **body,
        extra_body={"test_script": "ok"},  # type: ignore[arg-type]
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == len(rendered["token_ids"])
    texts = post(scripted_server, "/v1/completions/render", {"prompt": ["a b", "c"]}).json()
    assert [len(r["token_ids"]) for r in texts] == [2, 1]
    refused = post(scripted_server, "/v1/chat/completions/render", {**body, "max_tokens": 10**8})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "b"}]}, "messages[0].role"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens[1]"),
        ("/detokenize", {"tokens": [10**9]}, "tokens[0]"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {}, "tokens"),
        ("/v1/chat/completions/render", {"messages": []}, "messages"),
        (
            "/v1/chat/completions/render",
            {"messages": [{"role": "user", "content": "b"}], "tools": [{"type": "nope"}]},
            "tools[0]",
        ),
        ("/v1/completions/render", {"prompt": [[-1]]}, "prompt[0]"),
        ("/v1/completions/render", {"prompt": "a", "stop_token_ids": [10**9]}, "stop_token_ids"),
    ],
)
def test_bad_tokenizer_requests_are_400_naming_the_field(
    scripted_server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    answer = post(scripted_server, path, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


# -- prompt logprobs, several prompts ------------------------------------------------------


def reference_logprobs(tiny_qwen3: Path, ids: list[int]) -> list[float]:
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(tiny_qwen3))
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return [logprobs[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def test_echo_with_logprobs_scores_the_prompt_in_the_prefill(
    scripted_server: Server, tokenizer: Any, tiny_qwen3: Path
) -> None:
    prompt = "One two three four five six seven eight nine ten. " * 4
    ids = tokenizer.encode(prompt)
    want = reference_logprobs(tiny_qwen3, ids)
    # a first request puts the prompt in the prefix cache: the scored one must still
    # compute every position
    post(scripted_server, "/v1/completions", {"prompt": ids, "max_tokens": 1})
    for stream in (False, True):
        body = {"prompt": ids, "max_tokens": 2, "logprobs": 2, "echo": True, "temperature": 0,
                "stream": stream, "test_script": " ok"}  # fmt: skip
        answer = post(scripted_server, "/v1/completions", body)
        if stream:
            chunks = [json.loads(line[6:]) for line in answer.text.splitlines()
                      if line.startswith("data: {")]  # fmt: skip
            first = chunks[0]["choices"][0]
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            lp = first["logprobs"]
        else:
            choice = answer.json()["choices"][0]
            text, lp = choice["text"], choice["logprobs"]
        assert text == prompt + " ok"
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        got = lp["token_logprobs"][1 : len(ids)]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
        for value, top in zip(got, lp["top_logprobs"][1 : len(ids)], strict=True):
            assert len(top) == 2 and max(top.values()) >= value - 1e-6


def test_vllm_prompt_logprobs_on_completions_and_chat(
    client: openai.OpenAI, tokenizer: Any, tiny_qwen3: Path
) -> None:
    ids = tokenizer.encode("Counting: one, two, three, four.")
    want = reference_logprobs(tiny_qwen3, ids)
    answer = client.completions.create(
        model="tiny", prompt=ids, max_tokens=2, extra_body={"prompt_logprobs": 3}
    )
    scored = answer.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    assert scored[0] is None and len(scored) == len(ids)
    for position, entry in enumerate(scored[1:], start=1):
        mine = entry[str(ids[position])]
        assert abs(mine["logprob"] - want[position - 1]) < 1e-4
        ranked = sorted(
            (v["rank"], v["logprob"]) for k, v in entry.items() if k != str(ids[position])
        )
        assert [r for r, _ in ranked][:3] == [1, 2, 3][: len(ranked)]
        assert mine["rank"] >= 1 and (mine["rank"] > 1 or mine["logprob"] >= ranked[0][1] - 1e-6)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_body={"prompt_logprobs": 0},
    )  # fmt: skip
    scored = chat.model_extra["prompt_logprobs"]  # type: ignore[index]
    assert chat.usage is not None and len(scored) == chat.usage.prompt_tokens
    assert all(len(entry) == 1 for entry in scored[1:])


def processed_tokens(server: Server) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    found = re.search(r"^mlxcore_prompt_tokens_processed (\S+)$", text, re.MULTILINE)
    assert found is not None
    return float(found.group(1))


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_score_their_prompt_once(
    scripted_server: Server, client: openai.OpenAI, tokenizer: Any, tiny_qwen3: Path, stream: bool
) -> None:
    """The first choice computes the prompt's logprobs; the others wait for its prefill
    (parked behind it) and carry the same logprobs: the prompt runs through the model
    once, not ``n`` times."""
    ids = tokenizer.encode("Alpha beta gamma delta epsilon zeta eta theta iota. " * 24)
    want = reference_logprobs(tiny_qwen3, ids)
    before = processed_tokens(scripted_server)
    answer = client.completions.create(
        model="tiny", prompt=ids, n=3, max_tokens=2, echo=True, logprobs=1, stream=stream,
        extra_body={"prompt_logprobs": 1, "ignore_eos": True},
    )  # fmt: skip
    processed = processed_tokens(scripted_server) - before
    if stream:
        heads: dict[int, Any] = {}
        for chunk in answer:
            for c in chunk.choices:
                heads.setdefault(c.index, c)  # the echoed prompt comes first, once scored
        choices = [heads[i] for i in range(3)]
    else:
        choices = sorted(answer.choices, key=lambda c: c.index)  # type: ignore[union-attr]
    assert len(choices) == 3
    for choice in choices:
        scored = choice.model_extra["prompt_logprobs"]  # type: ignore[index]
        assert scored[0] is None and len(scored) == len(ids)
        for position, entry in enumerate(scored[1:], start=1):
            assert abs(entry[str(ids[position])]["logprob"] - want[position - 1]) < 1e-4
        echoed = choice.logprobs.token_logprobs  # type: ignore[union-attr]
        assert echoed[0] is None and len(echoed) >= len(ids)
        assert all(abs(a - b) < 1e-4 for a, b in zip(echoed[1 : len(ids)], want, strict=True))
    assert len(ids) <= processed < 1.5 * len(ids), (processed, len(ids))


def test_several_prompts_in_one_completion_request(client: openai.OpenAI) -> None:
    answer = client.completions.create(
        model="tiny", prompt=["first prompt", "the second one"], n=2, max_tokens=3,
        echo=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert [c.text.split(" ")[0] for c in answer.choices] == ["first", "first", "the", "the"]
    assert answer.usage is not None and answer.usage.completion_tokens == 12
    assert answer.usage.prompt_tokens == 2 + 3  # each prompt counted once


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": ["a", [1, 2]]}, "prompt"),
        ({"prompt": ["a", ""]}, "prompt[1]"),
        ({"prompt": [[1, 2], [-3]]}, "prompt[1]"),
        ({"prompt": ["a"] * 129}, "prompt"),
    ],
)
def test_bad_prompts_are_400s(scripted_server: Server, body: dict[str, Any], param: str) -> None:
    answer = post(scripted_server, "/v1/completions", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_tokenizer_info_is_what_lm_eval_s_remote_tokenizer_reads(
    scripted_server: Server, tokenizer: Any
) -> None:
    info = httpx.get(scripted_server.base_url + "/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == tokenizer.eos_token
    assert "messages" in info["chat_template"]  # the template the server renders with
    assert info["vocab_size"] == len(tokenizer) and isinstance(info["model_max_length"], int)
