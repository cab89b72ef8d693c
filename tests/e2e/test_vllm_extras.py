"""vLLM's request extras that benchmark and agent clients send, over HTTP with the
official openai client: ``ignore_eos`` (guidellm and vLLM's benchmark client send it on
every request), ``min_tokens``, ``stop_token_ids`` and
``stream_options.continuous_usage_stats``; a field nobody reads is reported once.

The scripted test plugin makes the model write a short text and then its end-of-sequence
token, so where generation stops is known."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)


def complete(client: openai.OpenAI, **extra: Any) -> Any:
    return client.completions.create(
        model="tiny", prompt="Say hi:", max_tokens=12, temperature=0,
        extra_body={"test_script": "Hi there", **extra},
    )  # fmt: skip


def test_ignore_eos_runs_to_max_tokens(client: openai.OpenAI) -> None:
    short = complete(client)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 12
    full = complete(client, ignore_eos=True)
    assert full.usage.completion_tokens == 12 and full.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=9,
        extra_body={"test_script": "Hi", "ignore_eos": True},
    )  # fmt: skip
    assert chat.usage.completion_tokens == 9 and chat.choices[0].finish_reason == "length"


def test_min_tokens_holds_back_the_end_of_sequence(client: openai.OpenAI) -> None:
    short = complete(client)
    scripted = short.usage.completion_tokens  # the text, then the end of sequence
    held = complete(client, min_tokens=scripted + 4)
    assert held.usage.completion_tokens >= scripted + 4
    assert held.choices[0].text.startswith("Hi there")
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, min_tokens=13)
    assert err.value.body["param"] == "min_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, min_tokens=-1)
    assert err.value.body["param"] == "min_tokens"  # type: ignore[index]


def test_stop_token_ids_end_the_generation(client: openai.OpenAI, scripted_server: Server) -> None:
    from mlx_lm import load

    from mlxcore.testing import build_test_model

    tokenizer = load(str(build_test_model("qwen3")), lazy=True)[1]
    there = tokenizer.encode(" there", add_special_tokens=False)[0]
    script = {"test_script": "Hi there friend"}
    assert complete(client, **script).choices[0].text == "Hi there friend"
    stopped = complete(client, stop_token_ids=[there], **script)
    # as vLLM: the stop token's own text stays (it is not a special token)
    assert stopped.choices[0].text == "Hi there" and stopped.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, stop_token_ids=[10**9])
    assert err.value.body["param"] == "stop_token_ids"  # type: ignore[index]


def test_continuous_usage_stats_count_as_they_go(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        extra_body={"test_script": "one two three four"},
    )  # fmt: skip
    counts = [chunk.usage.completion_tokens for chunk in stream if chunk.usage is not None]
    assert len(counts) >= 4
    assert counts == sorted(counts) and counts[-1] > counts[0]


def test_a_field_nobody_reads_is_reported_once(
    client: openai.OpenAI, scripted_server: Server
) -> None:
    for _ in range(3):
        complete(client, surely_unknown_field_xyz=1)
    log = scripted_server.log()
    assert log.count("'surely_unknown_field_xyz' is not known to this server") == 1
    assert "'test_script' is not known" not in log


def test_a_body_of_made_up_field_names_is_refused_before_it_is_kept(
    client: openai.OpenAI, scripted_server: Server
) -> None:
    """A flood of names this server does not define would live as long as the request:
    past ``MAX_EXTRA_FIELDS`` the body is a 400 and nothing is logged per name."""
    from mlxcore.server.frontend import MAX_EXTRA_FIELDS

    many = {f"made_up_{i}": 1 for i in range(MAX_EXTRA_FIELDS)}  # with test_script: one over
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, **many)
    assert f"at most {MAX_EXTRA_FIELDS}" in err.value.message
    assert "'made_up_0' is not known" not in scripted_server.log()
    many.pop("made_up_0")  # exactly the bound: served, each name reported once
    assert complete(client, **many).choices[0].text == "Hi there"
    assert "'made_up_1' is not known" in scripted_server.log()
