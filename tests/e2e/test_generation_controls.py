"""Generation controls over HTTP: exact continuation text, vLLM's tokenizer routes.

The scripted test plugin makes the model write a known text, so what the server must
return is known to the character."""

from __future__ import annotations

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
    ],
)
def test_bad_tokenizer_requests_are_400_naming_the_field(
    scripted_server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    answer = post(scripted_server, path, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
