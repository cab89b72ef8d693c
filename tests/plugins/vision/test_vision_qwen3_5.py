"""Qwen3.5 vision-language checkpoints: per-request routing with MTP on the text path.

The tiny Qwen3.5 VLM (official layout: ``model.language_model.*``, ``model.visual.*`` and
an ``mtp.*`` head) is served with ``--plugin qwen35-mtp``. Text-only requests run on
mlx-lm's Qwen3.5 text model built from the VLM's own arrays, with MTP speculation, and
are token-identical to ``mlx_lm`` on the same checkpoint; image requests prefill through
mlx-vlm and decode in the same batch; peak memory stays that of the VLM alone.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
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
    video_uri,
)

from mlxcore.testing.server import Server, ServerFactory
from mlxcore_vision.testing import build_test_vlm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("vision-qwen3_5")]

MAX_TOKENS = 12
TEXT_TOKENS = 32
TEXTS = ["Tell me a story.", "List three colours.", "Say hello.", "Count to five."]


@pytest.fixture(
    scope="module", params=["qwen3_5", pytest.param("qwen3_5_moe", marks=pytest.mark.long)]
)
def tiny_qwen3_5_vl(request: pytest.FixtureRequest) -> Path:
    """The dense and the MoE Qwen3.5 VLM (experts fused as in the checkpoints; the MoE
    variant in `make test-long`)."""
    return build_test_vlm(request.param, seed=0)


@pytest.fixture(scope="module")
def mtp_server(mlxcore_server: ServerFactory, tiny_qwen3_5_vl: Path) -> Server:
    """The VLM with MTP on (kept on even where it does not pay, so every text request
    really speculates)."""
    return start_like_reference(
        mlxcore_server,
        tiny_qwen3_5_vl,
        "--served-model-name",
        "tiny-qwen35-vl",
        "--plugin",
        "qwen35-mtp",
        "--num-speculative-tokens",
        "2",
        "--no-mtp-auto-off",
    )


@pytest.fixture(scope="module")
def vlm_reference(tiny_qwen3_5_vl: Path) -> Reference:
    return Reference(tiny_qwen3_5_vl)


class TextReference:
    """Greedy ``mlx_lm`` on the same checkpoint (mlx-lm reads Qwen3.5 VLMs text-only)."""

    def __init__(self, path: Path, chat: Reference) -> None:
        from mlx_lm import load

        self.model, self.tokenizer = load(str(path))
        self.chat = chat

    def generate(self, text: str, max_tokens: int) -> list[str]:
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        ids = self.tokenizer.encode(self.chat.prompt(text, 0), add_special_tokens=False)
        steps = stream_generate(
            self.model, self.tokenizer, ids, max_tokens=max_tokens, sampler=make_sampler(0.0)
        )
        return self.chat.texts([s.token for s in steps])


@pytest.fixture(scope="module")
def text_reference(tiny_qwen3_5_vl: Path, vlm_reference: Reference) -> TextReference:
    return TextReference(tiny_qwen3_5_vl, vlm_reference)


def chat(server: Server, content: Any, max_tokens: int, logprobs: bool = True) -> httpx.Response:
    return chat_request(server, "tiny-qwen35-vl", content, max_tokens, logprobs=logprobs)


def ask(server: Server, content: Any, max_tokens: int = MAX_TOKENS) -> list[str]:
    return tokens_of(chat(server, content, max_tokens))


def test_text_requests_take_the_text_path_with_mtp_lossless(
    mtp_server: Server, text_reference: TextReference
) -> None:
    drafted = metric(mtp_server, "mlxcore_decoder_speculative_drafted")
    text_path = metric(mtp_server, "mlxcore_prefill_vision_requests_text_path")
    expected = [text_reference.generate(t, TEXT_TOKENS) for t in TEXTS]
    assert len({tuple(e) for e in expected}) == len(TEXTS)  # the prompt matters
    for text, tokens in zip(TEXTS, expected, strict=True):  # one at a time
        assert ask(mtp_server, text, TEXT_TOKENS) == tokens, text
    with concurrent.futures.ThreadPoolExecutor(len(TEXTS)) as pool:  # speculating together
        replies = [pool.submit(ask, mtp_server, t, TEXT_TOKENS) for t in TEXTS]
        assert [r.result() for r in replies] == expected
    assert metric(mtp_server, "mlxcore_prefill_vision_requests_text_path") == text_path + 8
    assert metric(mtp_server, "mlxcore_decoder_speculative_drafted") > drafted


def test_image_requests_beside_speculating_text_requests(
    mtp_server: Server, vlm_reference: Reference, text_reference: TextReference
) -> None:
    images = [noise_image(41), noise_image(42, (64, 96))]
    expected = [vlm_reference.generate("Describe.", [im], MAX_TOKENS)[0] for im in images]
    assert expected[0] != expected[1]  # the image matters
    vision_path = metric(mtp_server, "mlxcore_prefill_vision_requests_vision_path")
    offset = metric(mtp_server, "mlxcore_decoder_speculative_plain_offset")
    for image, ids in zip(images, expected, strict=True):
        assert ask(mtp_server, media_content("Describe.", image)) == vlm_reference.texts(ids)
    texts = TEXTS[:3]
    text_expected = [text_reference.generate(t, TEXT_TOKENS) for t in texts]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(ask, mtp_server, t, TEXT_TOKENS) for t in texts]
        image_reply = pool.submit(ask, mtp_server, media_content("Describe.", images[0]))
        assert image_reply.result() == vlm_reference.texts(expected[0])
        assert [f.result() for f in running] == text_expected
    assert metric(mtp_server, "mlxcore_prefill_vision_requests_vision_path") == vision_path + 3
    # media sequences (shifted M-RoPE positions) decode in MTP's plain batch
    assert metric(mtp_server, "mlxcore_decoder_speculative_plain_offset") == offset + 3


_VLM_ALONE = """
import json, sys
import mlx.core as mx
from mlx_vlm import generate, load
from PIL import Image
import numpy as np

path, prompt_text, prompt_image, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model, processor = load(path)
loaded = mx.get_active_memory()
image = Image.fromarray(np.random.default_rng(5).integers(0, 256, (80, 100, 3), dtype=np.uint8))
generate(model, processor, prompt_text, max_tokens=tokens, temperature=0.0, verbose=False)
generate(model, processor, prompt_image, image=[image], max_tokens=tokens, temperature=0.0,
         verbose=False)
print(json.dumps({"loaded": loaded, "peak": mx.get_peak_memory()}))
"""


@pytest.mark.long
def test_peak_memory_with_routing_and_mtp_is_that_of_the_vlm_alone(
    mlxcore_server: ServerFactory,
) -> None:
    """A fresh server (vision, text routing, MTP head) serving one text and one image
    request, against ``mlx_vlm`` alone in a fresh process doing the same two generations.

    On the small model (text hidden size 512, 8 layers): as in real checkpoints the
    weights outweigh the per-step buffers (logits over the 151k vocabulary), which would
    otherwise decide the comparison."""
    model = build_test_vlm("qwen3_5", seed=0, size="small")
    template = Reference(build_test_vlm("qwen3_5", seed=0))  # the same tokenizer and template
    server = start_like_reference(
        mlxcore_server,
        model,
        "--served-model-name",
        "tiny-qwen35-vl",
        "--plugin",
        "qwen35-mtp",
        "--num-speculative-tokens",
        "2",
    )
    loaded = metric(server, "mlxcore_memory_active_bytes")
    for content in ("Tell me a story.", media_content("Describe.", noise_image(5))):
        assert chat(server, content, TEXT_TOKENS, logprobs=False).status_code == 200
    peak = metric(server, "mlxcore_memory_peak_bytes")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _VLM_ALONE,
            str(model),
            template.prompt("Tell me a story.", 0),
            template.prompt("Describe.", 1),
            str(TEXT_TOKENS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    alone = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"memory: server loaded {loaded:.0f} peak {peak:.0f}; mlx-vlm alone {alone}")
    # a second copy of the language model would add about 3/4 of the VLM's weights; what
    # the server adds after loading is the MTP head (its own weights) and nothing more
    import mlx.core as mx

    head = sum(
        v.nbytes
        for k, v in mx.load(str(model / "model.safetensors")).items()
        if k.startswith("mtp.")
    )
    assert loaded <= alone["loaded"] + head + 0.005 * alone["loaded"], (loaded, head, alone)
    assert peak <= 1.05 * alone["peak"], (peak, alone)


def test_native_video_matches_mlx_vlm(
    mtp_server: Server, vlm_reference: Reference, tmp_path: Path
) -> None:
    """Qwen3.5's own video pipeline (temporal patches, timestamps in the prompt)."""
    clip = make_video(tmp_path / "clip.mp4", frames=8)
    expected, _ = vlm_reference.generate("What happens?", [], MAX_TOKENS, videos=[clip])
    content = [
        {"type": "video_url", "video_url": {"url": video_uri(clip)}},
        {"type": "text", "text": "What happens?"},
    ]
    assert ask(mtp_server, content) == vlm_reference.texts(expected)
