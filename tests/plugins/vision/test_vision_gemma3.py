"""A second family over HTTP: Gemma 3 (SigLIP encoder, plain RoPE, sliding-window layers).

Image requests are token-identical to ``mlx_vlm.generate`` alone and while three text
requests decode in the same batch; those text requests run on the language model alone
and match mlx-vlm's text-only output.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
from conftest import start_like_reference
from vision_helpers import (
    Reference,
    chat_request,
    make_video,
    media_content,
    noise_image,
    tokens_of,
    video_uri,
)

from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("vision-gemma3")]

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def gemma_server(mlxcore_server: ServerFactory, tiny_gemma3_vl: Path) -> Server:
    return start_like_reference(
        mlxcore_server, tiny_gemma3_vl, "--served-model-name", "tiny-gemma3"
    )


@pytest.fixture(scope="module")
def gemma_reference(tiny_gemma3_vl: Path) -> Reference:
    return Reference(tiny_gemma3_vl)


def ask(server: Server, content: Any, max_tokens: int = MAX_TOKENS) -> list[str]:
    return tokens_of(chat_request(server, "tiny-gemma3", content, max_tokens, no_thinking=False))


def test_gemma3_image_alone_and_in_a_batch(
    gemma_server: Server, gemma_reference: Reference
) -> None:
    images = [noise_image(31), noise_image(32)]
    expected = [gemma_reference.generate("Describe.", [im], MAX_TOKENS)[0] for im in images]
    assert expected[0] != expected[1]  # the image matters
    for image, ids in zip(images, expected, strict=True):
        assert ask(gemma_server, media_content("Describe.", image)) == gemma_reference.texts(ids)
    texts = ["Tell me a story.", "List three colours.", "Say hello."]
    text_expected = [gemma_reference.generate_text_ids(t, 48) for t in texts]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(ask, gemma_server, t, 48) for t in texts]
        image_reply = pool.submit(ask, gemma_server, media_content("Describe.", images[0]))
        assert image_reply.result() == gemma_reference.texts(expected[0])
        for future, ids in zip(running, text_expected, strict=True):
            assert future.result() == gemma_reference.texts(ids)


def test_gemma3_video_becomes_ordered_frames(
    gemma_server: Server, gemma_reference: Reference, tmp_path: Path
) -> None:
    """No native video pipeline: the clip's sampled frames are consecutive images."""
    from mlx_vlm.utils import load_video
    from PIL import Image

    clip = make_video(tmp_path / "clip.mp4", frames=8)
    frames, _ = load_video(str(clip), max_frames=8)
    images = [Image.fromarray(f.transpose(1, 2, 0)) for f in frames]
    assert len(images) == 4  # mlx-vlm's default 2 fps of a 2-second clip
    expected, _ = gemma_reference.generate("What happens?", images, MAX_TOKENS)
    content = [
        {"type": "video_url", "video_url": {"url": video_uri(clip)}},
        {"type": "text", "text": "What happens?"},
    ]
    assert ask(gemma_server, content) == gemma_reference.texts(expected)
