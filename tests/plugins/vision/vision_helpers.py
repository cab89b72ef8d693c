"""Helpers for the vision plugin tests: images made with PIL and ``mlx_vlm.generate`` as
the reference."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from mlxcore.testing.server import Server


def noise_image(seed: int, size: tuple[int, int] = (100, 80)) -> Image.Image:
    """A random RGB image (width, height), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    """``image`` encoded (lossless PNG by default)."""
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def make_video(path: Path, frames: int, size: tuple[int, int] = (64, 48), fps: float = 4.0) -> Path:
    """Write a short real MPEG-4 clip of moving random blocks (OpenCV's encoder)."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
    rng = np.random.default_rng(frames)
    base = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    for i in range(frames):
        writer.write(np.roll(base, 4 * i, axis=1))
    writer.release()
    return path


def video_uri(path: Path) -> str:
    """A video file as a base64 data: URI."""
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def data_uri(image: Image.Image, fmt: str = "PNG") -> str:
    """``image`` as a base64 data: URI."""
    mime = f"image/{fmt.lower()}"
    return f"data:{mime};base64," + base64.b64encode(png_bytes(image, fmt)).decode()


class Reference:
    """``mlx_vlm.generate`` on the same folder: the greedy token ids for a prompt."""

    def __init__(self, path: Path) -> None:
        from mlx_vlm import load

        self.model, self.processor = load(str(path))
        self.tokenizer = self.processor.tokenizer

    def prompt(
        self,
        text: str,
        images: int,
        videos: int = 0,
        *,
        order: Sequence[str] | None = None,
        system: str | None = None,
    ) -> str:
        """The chat prompt the server renders (thinking off, so all output is content).

        ``order``: the media parts' kinds (``"image"`` / ``"video"``) in prompt order
        (default: the images, then the videos); ``system``: a system message first."""
        kinds = list(order) if order is not None else ["image"] * images + ["video"] * videos
        if (kinds.count("image"), kinds.count("video")) != (images, videos):
            raise ValueError(f"order {kinds} for {images} images and {videos} videos")
        content: list[dict[str, Any]] = [{"type": kind} for kind in kinds]
        content.append({"type": "text", "text": text})
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": content})
        rendered: str = self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        return rendered

    def generate(
        self,
        text: str,
        images: list[Image.Image],
        max_tokens: int,
        videos: list[Path] | None = None,
        *,
        order: Sequence[str] | None = None,
        system: str | None = None,
        **sampling: Any,
    ) -> tuple[list[int], int]:
        """(greedy token ids, prompt token count); ``sampling``: mlx-vlm's video fields;
        ``order`` and ``system`` as in :meth:`prompt` (``images`` and ``videos`` each in
        their prompt order). The prompt is the rendered template tokenized as it stands
        (mlx-vlm's own tokenization adds a second BOS to a Gemma template, which already
        starts with one)."""
        from mlx_vlm import generate

        inputs = self.inputs(
            self.prompt(text, len(images), len(videos or []), order=order, system=system),
            images,
            videos,
            **sampling,
        )
        result = generate(
            self.model,
            self.processor,
            "",
            max_tokens=max_tokens,
            temperature=0.0,
            verbose=False,
            **inputs,
            **sampling,
        )
        return list(result.token_ids), int(result.prompt_tokens)

    def inputs(
        self,
        prompt: str,
        images: list[Image.Image],
        videos: list[Path] | None = None,
        **sampling: Any,
    ) -> dict[str, Any]:
        """mlx-vlm's prepared inputs for ``prompt`` (the template's own special tokens
        only), as ``generate`` keyword arguments."""
        from mlx_vlm.utils import prepare_inputs

        prepared = prepare_inputs(
            self.processor,
            images=images or None,
            videos=[str(v) for v in videos or []] or None,
            prompts=prompt,
            image_token_index=getattr(self.model.config, "image_token_index", None),
            add_special_tokens=False,
            **sampling,
        )
        ids = prepared["input_ids"]
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids.shape[1] > 1 and int(ids[0, 0]) == int(ids[0, 1]) == bos:
            # Gemma 3's processor adds a BOS to a template that starts with one, whatever
            # add_special_tokens says: keep the template's own
            length = ids.shape[1]
            prepared = {
                k: v[:, 1:] if getattr(v, "shape", None) == (1, length) else v
                for k, v in prepared.items()
            }
        out = {k: v for k, v in prepared.items() if k != "attention_mask"}
        out["mask"] = prepared.get("attention_mask")
        return out

    def generate_text_ids(self, text: str, max_tokens: int) -> list[int]:
        """Greedy ids from ``mlx_vlm.generate`` for a text-only chat prompt, fed as the
        token ids the server's chat path produces (mlx-vlm's own text tokenization would
        add a second BOS to templates that already start with one, as Gemma's does)."""
        import mlx.core as mx
        from mlx_vlm import generate

        ids = self.tokenizer(self.prompt(text, 0), add_special_tokens=False).input_ids
        result = generate(
            self.model,
            self.processor,
            "",
            input_ids=mx.array([ids]),
            max_tokens=max_tokens,
            temperature=0.0,
            verbose=False,
        )
        return list(result.token_ids)

    def texts(self, ids: list[int]) -> list[str]:
        """Each token's text, as the server's logprobs report it."""
        return [self.tokenizer.decode([i]) for i in ids]


def tokens_of(response: httpx.Response) -> list[str]:
    """The token texts of a 200 chat completion requested with ``logprobs``."""
    assert response.status_code == 200, response.text
    return [t["token"] for t in response.json()["choices"][0]["logprobs"]["content"]]


def metric(server: Server, name: str) -> float:
    """One value of the server's /metrics (the first sample of ``name``)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    found = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name} not in /metrics:\n{text}"
    return float(found.group(1))


def chat_request(
    server: Server,
    model: str,
    content: Any,
    max_tokens: int,
    *,
    system: str | None = None,
    logprobs: bool = True,
    no_thinking: bool = True,
) -> httpx.Response:
    """A greedy, non-streamed chat completion with one user message of ``content``
    (after ``system`` when given); thinking off unless ``no_thinking`` is False."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": content})
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": logprobs,
    }
    if no_thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120)


def media_content(text: str, *media: Any) -> list[dict[str, Any]]:
    """Content parts: each image (PIL) or clip (``Path``) in order, then ``text``."""
    parts: list[dict[str, Any]] = []
    for item in media:
        if isinstance(item, Path):
            parts.append({"type": "video_url", "video_url": {"url": video_uri(item)}})
        else:
            parts.append({"type": "image_url", "image_url": {"url": data_uri(item)}})
    return [*parts, {"type": "text", "text": text}]
