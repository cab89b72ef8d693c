"""The vision plugin over HTTP, on a real ``mlxcore serve`` with a tiny real Qwen2-VL.

Greedy output for image requests is token-identical to ``mlx_vlm.generate`` (alone and
while three text requests decode in the same batch, streaming and not); text requests
on the same checkpoint take the text path and match mlx-vlm's text-only output; a
repeated image skips the vision encoder (/metrics); the official ``openai`` client sends
data URIs; bad images and disallowed sources are 400s naming the part.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image
from vision_helpers import (
    Reference,
    data_uri,
    make_video,
    metric,
    noise_image,
    png_bytes,
    tokens_of,
    video_uri,
)

from mlxcore.testing.server import Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("vision-server")]

MODEL = "tiny-vl"
MAX_TOKENS = 12
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def image_message(text: str, *urls: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": text})
    return [{"role": "user", "content": parts}]


def chat(server: Server, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": True,
        **NO_THINKING,
        **extra,
    }
    return httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def client(vision_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=vision_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_image_request_matches_mlx_vlm_generate(
    vision_server: Server, reference: Reference
) -> None:
    for seed, text in ((1, "Describe the picture."), (2, "What colour is it?")):
        image = noise_image(seed)
        expected, prompt_tokens = reference.generate(text, [image], MAX_TOKENS)
        reply = chat(vision_server, image_message(text, data_uri(image)))
        assert tokens_of(reply) == reference.texts(expected)
        assert reply.json()["usage"]["prompt_tokens"] == prompt_tokens
    # the image matters: two images, two different continuations
    a, _ = reference.generate("Describe the picture.", [noise_image(1)], MAX_TOKENS)
    b, _ = reference.generate("Describe the picture.", [noise_image(2)], MAX_TOKENS)
    assert a != b


def test_ollama_images_match_the_openai_route(vision_server: Server) -> None:
    """The ``ollama`` client's ``images`` (base64 sent by the client) reach the same media
    handler: the same greedy reply as the OpenAI route, which matches mlx-vlm above."""
    import ollama

    client = ollama.Client(host=vision_server.base_url, timeout=120)
    text = "Describe the picture."
    answer = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": text, "images": [png_bytes(noise_image(1))]}],
        options={"temperature": 0, "num_predict": MAX_TOKENS},
        think=False,
    )
    reference = chat(vision_server, image_message(text, data_uri(noise_image(1))))
    assert answer.message.content == reference.json()["choices"][0]["message"]["content"]
    assert answer.prompt_eval_count == reference.json()["usage"]["prompt_tokens"]
    with pytest.raises(ollama.ResponseError) as err:  # not an image: a 400 naming it
        client.chat(model=MODEL, messages=[{"role": "user", "content": "?", "images": [b"no"]}])
    assert err.value.status_code == 400


def test_two_images_in_one_message_match_mlx_vlm(
    vision_server: Server, reference: Reference
) -> None:
    images = [noise_image(3, (60, 60)), noise_image(4, (90, 56))]
    expected, _ = reference.generate("Compare them.", images, MAX_TOKENS)
    reply = chat(vision_server, image_message("Compare them.", *map(data_uri, images)))
    assert tokens_of(reply) == reference.texts(expected)


def stream_tokens(server: Server, text: str, max_tokens: int, started: threading.Event) -> Any:
    """A streamed greedy text chat: (token texts from the logprobs, time of the last chunk);
    ``started`` is set once the first token arrived."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "stream": True,
        **NO_THINKING,
    }
    tokens: list[str] = []
    with httpx.stream("POST", f"{server.v1}/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                tokens += [t["token"] for t in (choice.get("logprobs") or {}).get("content", [])]
            if tokens:
                started.set()
    return tokens, time.monotonic()


def test_image_request_in_a_batch_with_text_requests(
    vision_server: Server, reference: Reference
) -> None:
    """The image request prefills and decodes while three text streams are decoding."""
    texts = ["Tell me a story.", "List three colours.", "Say hello."]
    long = 160
    text_expected = [reference.generate_text_ids(t, long) for t in texts]
    image = noise_image(5)
    expected, _ = reference.generate("Describe the picture.", [image], MAX_TOKENS)
    messages = image_message("Describe the picture.", data_uri(image))
    flags = [threading.Event() for _ in texts]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        streams = [
            pool.submit(stream_tokens, vision_server, t, long, flag)
            for t, flag in zip(texts, flags, strict=True)
        ]
        for flag in flags:
            assert flag.wait(60)
        image_reply = chat(vision_server, messages)
        image_done = time.monotonic()
        results = [f.result() for f in streams]
    assert tokens_of(image_reply) == reference.texts(expected)
    # the text streams were still running when the image reply was complete
    assert image_done < min(done for _, done in results)
    for (got, _), ids in zip(results, text_expected, strict=True):
        assert got == reference.texts(ids)


def test_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    messages: Any = image_message("Describe the picture.", data_uri(noise_image(6)))
    whole = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0, extra_body=NO_THINKING
    )
    content = whole.choices[0].message.content
    assert content
    assert whole.choices[0].finish_reason in ("length", "stop")
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_body=NO_THINKING,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == content


def test_repeated_image_skips_the_vision_encoder(vision_server: Server) -> None:
    runs = "mlxcore_prefill_vision_encoder_runs"
    hits = "mlxcore_prefill_vision_encoder_cache_hits"
    image = data_uri(noise_image(7))
    before_runs, before_hits = metric(vision_server, runs), metric(vision_server, hits)
    first = tokens_of(chat(vision_server, image_message("Describe the picture.", image)))
    assert metric(vision_server, runs) == before_runs + 1
    second = tokens_of(chat(vision_server, image_message("Describe the picture.", image)))
    assert metric(vision_server, runs) == before_runs + 1  # the encoder did not run again
    assert metric(vision_server, hits) == before_hits + 1
    assert second == first
    # the same pixels in different bytes (JPEG instead of PNG) are a different image
    other = "data:image/jpeg;base64," + base64.b64encode(png_bytes(noise_image(7), "JPEG")).decode()
    tokens_of(chat(vision_server, image_message("Describe the picture.", other)))
    assert metric(vision_server, runs) == before_runs + 2


def test_text_and_vision_paths_are_counted(vision_server: Server) -> None:
    text_path = "mlxcore_prefill_vision_requests_text_path"
    vision_path = "mlxcore_prefill_vision_requests_vision_path"
    t0, v0 = metric(vision_server, text_path), metric(vision_server, vision_path)
    tokens_of(chat(vision_server, [{"role": "user", "content": "Hi"}]))
    assert (metric(vision_server, text_path), metric(vision_server, vision_path)) == (t0 + 1, v0)
    tokens_of(chat(vision_server, image_message("Hi", data_uri(noise_image(8)))))
    assert (metric(vision_server, text_path), metric(vision_server, vision_path)) == (
        t0 + 1,
        v0 + 1,
    )


def test_image_from_an_allowed_http_host(
    vision_server: Server, media_dir: Path, media_http: str, reference: Reference
) -> None:
    image = noise_image(12)
    image.save(media_dir / "remote.png")
    expected, _ = reference.generate("Describe the picture.", [image], MAX_TOKENS)
    reply = chat(vision_server, image_message("Describe the picture.", f"{media_http}/remote.png"))
    assert tokens_of(reply) == reference.texts(expected)
    missing = chat(vision_server, image_message("Describe.", f"{media_http}/missing.png"))
    assert missing.status_code == 400
    assert "could not fetch" in missing.json()["error"]["message"]


def test_local_file_under_the_allowed_path(
    vision_server: Server, media_dir: Path, reference: Reference
) -> None:
    image = noise_image(9)
    path = media_dir / "picture.png"
    image.save(path)
    expected, _ = reference.generate("Describe the picture.", [image], MAX_TOKENS)
    for url in (str(path), path.as_uri()):
        reply = chat(vision_server, image_message("Describe the picture.", url))
        assert tokens_of(reply) == reference.texts(expected)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


BAD_IMAGES = {
    "bad-base64": ("data:image/png;base64,!!!not base64!!!", "not valid base64"),
    "not-an-image": ("data:image/png;base64," + _b64(b"hello, I am text"), "not an image"),
    "truncated-png": (
        "data:image/png;base64," + _b64(png_bytes(noise_image(10))[:60]),
        "image",
    ),
    "too-many-pixels": (data_uri(Image.new("RGB", (300, 200), (1, 2, 3))), "--max-image-pixels"),
    "loopback-url": ("http://127.0.0.1:1/picture.png", "not allowed"),
    "other-host": ("http://localhost.example.com:1/picture.png", "not allowed"),
    "file-outside": ("/etc/hostname", "outside --allowed-local-media-path"),
    "ftp-url": ("ftp://example.com/picture.png", "unsupported media URL scheme"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_bad_images_are_400_naming_the_part(vision_server: Server, case: str) -> None:
    url, words = BAD_IMAGES[case]
    reply = chat(vision_server, image_message("Describe.", url))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"].startswith("messages[0].content[0]"), error
    assert words in error["message"], error
    assert vision_server.alive()


def test_unsupported_part_type_is_400(vision_server: Server) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
        }
    ]
    reply = chat(vision_server, messages)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "messages[0].content[0].type"


def test_openai_client_sends_a_data_uri(client: openai.OpenAI, reference: Reference) -> None:
    image = noise_image(11)
    expected, _ = reference.generate("Describe the picture.", [image], MAX_TOKENS)
    messages: Any = image_message("Describe the picture.", data_uri(image))
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        extra_body=NO_THINKING,
    )
    assert reply.choices[0].logprobs is not None
    got = [t.token for t in reply.choices[0].logprobs.content or []]
    assert got == reference.texts(expected)
    assert reply.usage is not None and reply.usage.completion_tokens == len(expected)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=image_message("x", "data:image/png;base64,@@"), max_tokens=4
        )
    assert "base64" in str(err.value)


def video_message(text: str, url: str) -> list[dict[str, Any]]:
    parts = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


def test_video_request_matches_mlx_vlm_generate(
    vision_server: Server, reference: Reference, tmp_path: Path
) -> None:
    """Qwen2-VL's native video path: temporal patches and M-RoPE over time."""
    clip = make_video(tmp_path / "clip.mp4", frames=8)
    expected, prompt_tokens = reference.generate("What happens?", [], MAX_TOKENS, [clip])
    reply = chat(vision_server, video_message("What happens?", video_uri(clip)))
    assert tokens_of(reply) == reference.texts(expected)
    assert reply.json()["usage"]["prompt_tokens"] == prompt_tokens
    # per-request sampling changes the video tokens, exactly as in mlx-vlm
    default_tokens = prompt_tokens
    expected, prompt_tokens = reference.generate(
        "What happens?", [], MAX_TOKENS, [clip], fps=4.0, max_frames=8
    )
    reply = chat(
        vision_server,
        video_message("What happens?", video_uri(clip)),
        video_fps=4,
        video_max_frames=8,
    )
    assert tokens_of(reply) == reference.texts(expected)
    assert reply.json()["usage"]["prompt_tokens"] == prompt_tokens != default_tokens


def test_bad_videos_are_400(vision_server: Server, tmp_path: Path) -> None:
    not_video = "data:video/mp4;base64," + _b64(b"definitely not a video")
    reply = chat(vision_server, video_message("What?", not_video))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "messages[0].content[0]"
    assert "not a video" in reply.json()["error"]["message"]
    empty = make_video(tmp_path / "empty.mp4", frames=0)
    reply = chat(vision_server, video_message("What?", video_uri(empty)))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages[0].content[0]"
    clip = video_uri(make_video(tmp_path / "clip.mp4", frames=4))
    reply = chat(vision_server, video_message("What?", clip), video_fps=0)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "video_fps"
    mixed = video_message("What?", clip)
    mixed[0]["content"].insert(
        0, {"type": "image_url", "image_url": {"url": data_uri(noise_image(1))}}
    )
    reply = chat(vision_server, mixed)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "messages[0].content[1]"
