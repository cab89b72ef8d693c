"""Qwen3-VL over HTTP: deepstack features, native video, images with videos in one request.

The tiny Qwen3-VL (mlx-vlm's ``qwen3_vl.Model``: Qwen3 text layers with interleaved
M-RoPE, a vision tower whose two blocks feed deepstack features into the first two text
layers) is served and every greedy reply is compared with ``mlx_vlm.generate`` on the same
model, prompt and media. A repeated image skips the vision encoder and must still give
mlx-vlm's output: the cached encoding carries the deepstack features, which mlx-vlm's
own cached-features path would drop.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import start_like_reference
from vision_helpers import (
    Reference,
    chat_request,
    make_video,
    media_content,
    metric,
    noise_image,
    tokens_of,
)

from mlxcore.testing.server import Server, ServerFactory
from mlxcore_vision.testing import build_test_vlm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("vision-qwen3_vl")]

MAX_TOKENS = 12
TEXT_TOKENS = 32
NAME = "tiny-qwen3-vl"
RUNS = "mlxcore_prefill_vision_encoder_runs"
HITS = "mlxcore_prefill_vision_encoder_cache_hits"


@pytest.fixture(scope="module")
def tiny_qwen3_vl() -> Path:
    return build_test_vlm("qwen3_vl", seed=0)


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3_vl: Path) -> Server:
    return start_like_reference(mlxcore_server, tiny_qwen3_vl, "--served-model-name", NAME)


@pytest.fixture(scope="module")
def small_steps(mlxcore_server: ServerFactory, tiny_qwen3_vl: Path) -> Server:
    """Prefill chunks of 8 tokens: every media run is cut by chunk boundaries."""
    return start_like_reference(
        mlxcore_server, tiny_qwen3_vl, "--served-model-name", NAME, "--prefill-step-size", "8"
    )


@pytest.fixture(scope="module")
def reference(tiny_qwen3_vl: Path) -> Reference:
    return Reference(tiny_qwen3_vl)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_video(tmp_path_factory.mktemp("qwen3-vl") / "clip.mp4", frames=8)


def chat(
    server: Server, content: Any, max_tokens: int = MAX_TOKENS, system: str | None = None
) -> httpx.Response:
    return chat_request(server, NAME, content, max_tokens, system=system)


def ask(
    server: Server, content: Any, max_tokens: int = MAX_TOKENS, system: str | None = None
) -> list[str]:
    return tokens_of(chat(server, content, max_tokens, system))


def expected(reference: Reference, text: str, *media: Any, system: str | None = None) -> list[str]:
    """``mlx_vlm.generate``'s greedy tokens for ``media_content(text, *media)``."""
    images = [m for m in media if not isinstance(m, Path)]
    videos = [m for m in media if isinstance(m, Path)]
    order = ["video" if isinstance(m, Path) else "image" for m in media]
    ids, _ = reference.generate(text, images, MAX_TOKENS, videos=videos, order=order, system=system)
    return reference.texts(ids)


def media_runs(reference: Reference, text: str, *images: Any) -> list[tuple[int, int]]:
    """(start, end) of each image's run of tokens in the processed prompt."""
    from mlx_vlm.utils import prepare_inputs

    token = reference.model.config.image_token_index
    inputs = prepare_inputs(
        reference.processor,
        images=list(images),
        prompts=reference.prompt(text, len(images)),
        image_token_index=token,
    )
    ids = inputs["input_ids"][0].tolist()
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t == token:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    return runs


def test_the_test_model_loads_in_mlx_vlm_with_deepstack(tiny_qwen3_vl: Path) -> None:
    from mlx_vlm import load
    from mlx_vlm.models import qwen3_vl

    model, processor = load(str(tiny_qwen3_vl))
    assert isinstance(model, qwen3_vl.Model)
    assert model.config.vision_config.deepstack_visual_indexes == [0, 1]
    assert model.vision_tower is not None
    assert len(model.vision_tower.deepstack_merger_list) == 2
    rope = model.config.text_config.rope_scaling
    assert rope is not None and rope["mrope_section"] == [4, 2, 2]
    assert type(processor).__name__ == "Qwen3VLProcessor"


def test_image_alone_and_beside_text_requests(server: Server, reference: Reference) -> None:
    images = [noise_image(31), noise_image(32, (128, 96))]
    wanted = [expected(reference, "Describe.", im) for im in images]
    assert wanted[0] != wanted[1]  # the image matters
    for image, tokens in zip(images, wanted, strict=True):
        assert ask(server, media_content("Describe.", image)) == tokens
    texts = ["Tell me a story.", "List three colours.", "Say hello."]
    text_wanted = [reference.texts(reference.generate_text_ids(t, TEXT_TOKENS)) for t in texts]
    assert len({tuple(t) for t in text_wanted}) == len(texts)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(ask, server, t, TEXT_TOKENS) for t in texts]
        image_reply = pool.submit(ask, server, media_content("Describe.", images[0]))
        assert image_reply.result() == wanted[0]
        assert [f.result() for f in running] == text_wanted


def test_repeated_image_skips_the_encoder_and_keeps_deepstack(
    server: Server, reference: Reference
) -> None:
    """The second request differs before the image (another system message), so no
    prefix past the image is reused: the whole image is embedded from the cached
    encoding, deepstack features included."""
    image = noise_image(33)
    first = expected(reference, "Describe.", image, system="You are A.")
    second = expected(reference, "Describe.", image, system="You are B.")
    runs, hits = metric(server, RUNS), metric(server, HITS)
    assert ask(server, media_content("Describe.", image), system="You are A.") == first
    assert (metric(server, RUNS), metric(server, HITS)) == (runs + 1, hits)
    reply = chat(server, media_content("Describe.", image), system="You are B.")
    assert tokens_of(reply) == second
    assert (metric(server, RUNS), metric(server, HITS)) == (runs + 1, hits + 1)
    prompt = reference.prompt("Describe.", 1, system="You are B.")
    ids = reference.tokenizer.encode(prompt, add_special_tokens=False)
    cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached < ids.index(reference.model.config.image_token_index), cached


def test_dropping_deepstack_would_change_the_reply(reference: Reference) -> None:
    """The repeated-image test can fail: without its deepstack features (what mlx-vlm's
    own cached-features path does) the reply for that image is another."""
    image = noise_image(33)
    wanted = expected(reference, "Describe.", image, system="You are B.")
    reference.model._merge_deepstack_features = lambda *args: None
    try:
        dropped = expected(reference, "Describe.", image, system="You are B.")
    finally:
        del reference.model._merge_deepstack_features
    assert dropped != wanted


def test_native_video_matches_mlx_vlm(server: Server, reference: Reference, clip: Path) -> None:
    assert ask(server, media_content("What happens?", clip)) == expected(
        reference, "What happens?", clip
    )


def test_images_and_video_in_one_request(server: Server, reference: Reference, clip: Path) -> None:
    """Both orders; the encoding cache is keyed by every medium of the request."""
    a, b = noise_image(34), noise_image(35, (96, 128))
    assert ask(server, media_content("Compare.", a, clip)) == expected(
        reference, "Compare.", a, clip
    )
    assert ask(server, media_content("Compare.", clip, b, a)) == expected(
        reference, "Compare.", clip, b, a
    )
    runs, hits = metric(server, RUNS), metric(server, HITS)
    assert ask(server, media_content("Compare.", b, clip)) == expected(
        reference, "Compare.", b, clip
    )  # another image with the same clip: a new encoding
    assert (metric(server, RUNS), metric(server, HITS)) == (runs + 1, hits)
    again = ask(server, media_content("Compare.", a, clip), system="Be brief.")
    assert again == expected(reference, "Compare.", a, clip, system="Be brief.")
    assert (metric(server, RUNS), metric(server, HITS)) == (runs + 1, hits + 1)


def test_small_prefill_steps_and_prefix_reuse_between_images(
    small_steps: Server, reference: Reference, clip: Path
) -> None:
    """Chunks of 8 tokens cut the image and video runs (deepstack rows are taken per
    chunk); a prompt that shares its first image with a cached one continues after it,
    with the deepstack rows of its second image taken past the cached ones."""
    a, b, c = noise_image(36), noise_image(37), noise_image(38)
    assert ask(small_steps, media_content("Describe.", a)) == expected(reference, "Describe.", a)
    assert ask(small_steps, media_content("Compare.", a, clip)) == expected(
        reference, "Compare.", a, clip
    )
    assert ask(small_steps, media_content("Compare.", a, b)) == expected(
        reference, "Compare.", a, b
    )
    reply = chat(small_steps, media_content("Compare.", a, c))
    assert tokens_of(reply) == expected(reference, "Compare.", a, c)
    cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    first, second = media_runs(reference, "Compare.", a, c)
    assert first[1] <= cached <= second[0], (cached, first, second)
