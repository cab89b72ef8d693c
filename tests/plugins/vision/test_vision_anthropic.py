"""Anthropic ``image`` blocks on a vision model, through the official ``anthropic`` client.

The Messages route hands image blocks to the same media handler as the OpenAI route, so
the same image and prompt must give the same greedy reply on both (the OpenAI route is
checked token by token against ``mlx_vlm.generate`` in test_vision_server.py), and the
prompt must have mlx-vlm's length.
"""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import pytest
from vision_helpers import Reference, data_uri, noise_image, png_bytes

from mlxcore.testing.server import Server

MODEL = "tiny-vl"
MAX_TOKENS = 12
#: temperature 0 (this SDK's typed signature has no temperature; the API takes it)
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(vision_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=vision_server.base_url, api_key="unused", max_retries=0, timeout=120
    )


def image_block(seed: int) -> dict[str, Any]:
    data = base64.b64encode(png_bytes(noise_image(seed))).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def openai_reply(server: Server, seed: int, text: str) -> str:
    import httpx

    body = {
        "model": MODEL,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_uri(noise_image(seed))}},
                    {"type": "text", "text": text},
                ],
            }
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    r = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"] or "")


def test_image_block_matches_the_openai_route_and_mlx_vlm(
    client: anthropic.Anthropic, vision_server: Server, reference: Reference
) -> None:
    text = "Describe the picture."
    _, prompt_tokens = reference.generate(text, [noise_image(1)], MAX_TOKENS)
    messages: Any = [{"role": "user", "content": [image_block(1), {"type": "text", "text": text}]}]
    msg = client.messages.create(
        model=MODEL, max_tokens=MAX_TOKENS, messages=messages, extra_body=GREEDY
    )
    reply = "".join(b.text for b in msg.content if b.type == "text")
    assert reply == openai_reply(vision_server, 1, text)
    assert msg.usage.input_tokens == prompt_tokens
    # streamed: the same text
    with client.messages.stream(
        model=MODEL, max_tokens=MAX_TOKENS, messages=messages, extra_body=GREEDY
    ) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == reply
    # another image, another prompt length-equal reply computed from that image
    other = client.messages.create(
        model=MODEL,
        max_tokens=MAX_TOKENS,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": [image_block(2), {"type": "text", "text": text}]}],
    )
    assert "".join(b.text for b in other.content if b.type == "text") == openai_reply(
        vision_server, 2, text
    )


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"type": "base64", "media_type": "image/png", "data": "%%%"}, "content[0]"),
        ({"type": "base64", "media_type": "text/plain", "data": "aGk="}, "source.media_type"),
        ({"type": "file", "file_id": "x"}, "source.type"),
    ],
)
def test_bad_image_blocks_are_400_naming_the_block(
    client: anthropic.Anthropic, source: dict[str, Any], field: str
) -> None:
    messages: Any = [
        {
            "role": "user",
            "content": [{"type": "image", "source": source}, {"type": "text", "text": "?"}],
        }
    ]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=4, messages=messages)
    assert info.value.status_code == 400
    assert "messages[0].content[0]" in str(info.value) and field in str(info.value)
