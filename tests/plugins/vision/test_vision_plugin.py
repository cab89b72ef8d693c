"""The vision plugin in process: the ``mlxcore_load_model`` hook, the text view sharing the
VLM's weights, routing through the real engine (M-RoPE position offset in the shared
batch), and how content parts become template parts and media parts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from vision_helpers import Reference, data_uri, make_video, noise_image, video_uri

from mlxcore.builtin.openai.convert import normalize_chat
from mlxcore.builtin.openai.schemas import Message
from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import MediaError
from mlxcore.hooks import PluginHooks
from mlxcore.media import MediaPart
from mlxcore.models import resolve_model
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore.server.errors import APIError
from mlxcore.testing.runtime import make_runtime, submit_together
from mlxcore_vision.loader import VisionLanguageText
from mlxcore_vision.media import MediaPolicy, VisionMedia, VisionPayload
from mlxcore_vision.testing import build_test_vlm


def normalize_text_chat(messages: list[Message]) -> list[dict[str, Any]]:
    """The template messages for a text-only model (no media handler)."""
    return normalize_chat(messages, None)[0]


def _hooks(**options: Any) -> tuple[PluginHooks, ServerConfig]:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("vision",), autoload=False))
    hooks = PluginHooks(pm)
    return hooks, ServerConfig(plugin_options=options)


def _runtime(model: Path) -> Runtime:
    return make_runtime(model, "vision")


@pytest.fixture(scope="module")
def runtime(tiny_qwen2_vl: Path) -> Any:
    rt = _runtime(tiny_qwen2_vl)
    yield rt
    rt.engine.shutdown()


@pytest.fixture(scope="module")
def qwen3_5_runtime() -> Any:
    """A Qwen3.5 VLM: mlx-lm's text model on the VLM's arrays, hybrid caches."""
    rt = _runtime(build_test_vlm("qwen3_5"))
    yield rt
    rt.engine.shutdown()


def test_mlxcore_load_model_passes_on_text_models(tiny_qwen3: Path) -> None:
    hooks, cfg = _hooks()
    assert hooks.load_model(resolve_model(str(tiny_qwen3)), cfg) is None


def test_mlxcore_load_model_loads_the_vlm_with_shared_weights(runtime: Runtime) -> None:
    model = runtime.model
    assert isinstance(model, VisionLanguageText)
    assert isinstance(runtime.media, VisionMedia)
    assert runtime.engine.prefill.name == "vision"
    # the text path runs on the VLM's own language model: one set of weights
    lm_weights = dict(_flat(model.vlm.language_model.parameters()))
    view_weights = dict(_flat(model.language_model.parameters()))
    assert lm_weights.keys() == view_weights.keys()
    assert all(lm_weights[k] is view_weights[k] for k in lm_weights)


def _flat(tree: Any) -> list[tuple[str, Any]]:
    from mlx.utils import tree_flatten

    return list(tree_flatten(tree))


def _run(rt: Runtime, request: GenerationRequest) -> tuple[list[int], FinishEvent]:
    tokens: list[int] = []
    finish = None
    for event in rt.engine.stream(request):
        if isinstance(event, TokenEvent):
            tokens += [t.token for t in event.tokens]
        elif isinstance(event, FinishEvent):
            finish = event
    assert finish is not None
    return tokens, finish


def test_media_request_through_the_engine_matches_mlx_vlm(
    runtime: Runtime, tiny_qwen2_vl: Path
) -> None:
    reference = Reference(tiny_qwen2_vl)
    image = noise_image(21)
    prompt = reference.prompt("Describe the picture.", 1)
    part = MediaPart({"type": "image_url", "image_url": {"url": data_uri(image)}}, "m[0]")
    prepared = runtime.media.prepare(prompt, [part], {})
    assert isinstance(prepared.payload, VisionPayload)
    expected, prompt_tokens = reference.generate("Describe the picture.", [image], 10)
    assert len(prepared.ids) == prompt_tokens
    request = GenerationRequest(tuple(prepared.ids), max_tokens=10, media=prepared.payload)
    tokens, finish = _run(runtime, request)
    assert finish.reason in ("length", "stop") and finish.error is None
    assert tokens == expected
    assert runtime.engine.prefill.stats()["vision_requests_vision_path"] >= 1
    # the image occupies fewer M-RoPE positions than tokens: decoding continued at a
    # position offset, which the plain decoder applied in the batch cache
    inputs = prepared.payload.inputs
    _, deltas = runtime.model.vlm.language_model.get_rope_index(
        mx.array(inputs["input_ids"]), mx.array(inputs["image_grid_thw"])
    )
    assert int(deltas.reshape(-1)[0].item()) < 0


def test_content_parts_become_placeholders_and_media_parts() -> None:
    handler = VisionMedia("qwen2_vl", None, None, MediaPolicy())
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content=[image, {"type": "text", "text": "What is it?"}]),
        Message(role="user", content="And the colour?"),
        Message(role="assistant", content="Red."),
        Message(role="user", content=[{"type": "text", "text": "a"}, image]),
    ]
    out, parts = normalize_chat(messages, handler)
    assert out[1]["content"] == [{"type": "image"}, {"type": "text", "text": "What is it?"}]
    assert out[2]["content"] == "And the colour?"  # consecutive user messages stay apart
    assert out[4]["content"] == [{"type": "text", "text": "a"}, {"type": "image"}]
    assert [p.where for p in parts] == ["messages[1].content[0]", "messages[4].content[1]"]
    with pytest.raises(APIError, match="system messages cannot contain media") as err:
        normalize_chat([Message(role="system", content=[image])], handler)
    assert err.value.param == "messages[0].content[0]"
    # a text-only model still refuses the image part, naming it
    with pytest.raises(APIError) as err:
        normalize_text_chat(messages)
    assert err.value.param == "messages[1].content[0].type"


def test_media_policy_from_flags(tmp_path: Path) -> None:
    cfg = ServerConfig(
        plugin_options={
            "allowed_media_domains": ["Example.com", ".cdn.org"],
            "allowed_local_media_path": str(tmp_path),
            "max_image_pixels": 100,
        }
    )
    policy = MediaPolicy.from_config(cfg)
    assert policy.allowed_domains == ("example.com", "cdn.org")
    assert policy.allowed_local_path == tmp_path.resolve()
    assert policy.max_image_pixels == 100 and not policy.allow_private
    handler = VisionMedia("qwen2_vl", None, None, policy)
    outside = tmp_path.parent / "elsewhere.png"
    with pytest.raises(MediaError, match="outside"):
        handler.fetch(str(tmp_path / ".." / "elsewhere.png"), "p")
    with pytest.raises(MediaError, match="not allowed"):
        handler.fetch("https://example.org/a.png", "p")
    with pytest.raises(MediaError, match="only base64"):
        handler.fetch("data:image/png,rawdata", "p")
    # an allowed host that resolves to a loopback address is still refused by default
    local = VisionMedia("qwen2_vl", None, None, MediaPolicy(allowed_domains=("localhost",)))
    with pytest.raises(MediaError, match="non-public address") as err:
        local.fetch("http://localhost:1/picture.png", "messages[0].content[0]")
    assert err.value.field == "messages[0].content[0].image_url"
    assert not outside.exists()


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_5"])
def test_prefix_reuse_is_keyed_by_the_image(arch: str, request: pytest.FixtureRequest) -> None:
    """A follow-up turn about the same image reuses the cached prefix past the image;
    the same text with another image reuses nothing past the image's placeholder.
    (Qwen3.5: the prefix is handed from the engine's mlx-lm caches to mlx-vlm's.)"""
    from mlx_vlm import generate

    runtime = request.getfixturevalue("runtime" if arch == "qwen2_vl" else "qwen3_5_runtime")
    reference = Reference(build_test_vlm(arch))
    image, other = noise_image(51), noise_image(52)
    first_text = reference.prompt("Describe the picture.", 1)

    def part(img: Any) -> MediaPart:
        return MediaPart({"type": "image_url", "image_url": {"url": data_uri(img)}}, "m[0]")

    first = runtime.media.prepare(first_text, [part(image)], {})
    assert first.cache_key is not None and first.cache_key != first.ids
    answer, _ = _run(
        runtime,
        GenerationRequest(
            tuple(first.ids), 6, media=first.payload, cache_key=tuple(first.cache_key)
        ),
    )
    follow_text = (
        first_text
        + reference.tokenizer.decode(answer)
        + "<|im_end|>\n<|im_start|>user\nSay more.<|im_end|>\n<|im_start|>assistant\n"
    )
    image_end = max(i for i, t in enumerate(first.ids) if t == 151655) + 1
    for img, reuses_image in ((image, True), (other, False)):
        prepared = runtime.media.prepare(follow_text, [part(img)], {})
        assert prepared.cache_key is not None
        request = GenerationRequest(
            tuple(prepared.ids), 8, media=prepared.payload, cache_key=tuple(prepared.cache_key)
        )
        tokens, finish = _run(runtime, request)
        cached = finish.usage.cached_tokens
        assert (cached >= image_end) is reuses_image, cached
        expected = generate(
            reference.model,
            reference.processor,
            follow_text,
            image=[img],
            max_tokens=8,
            temperature=0.0,
            verbose=False,
        )
        assert tokens == list(expected.token_ids)


def test_decoder_without_position_offsets_fails_media_requests_clearly(
    tiny_qwen2_vl: Path,
) -> None:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("vision", "offsetless_decoder"), autoload=False))
    hooks = PluginHooks(pm)
    cfg = ServerConfig(model=str(tiny_qwen2_vl))
    hooks.configure(cfg)
    rt = build_runtime(cfg, hooks)
    try:
        assert rt.engine.decoder.name == "offsetless"
        content = [{"type": "image"}, {"type": "text", "text": "Describe."}]
        reference_prompt = rt.tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        part = MediaPart(
            {"type": "image_url", "image_url": {"url": data_uri(noise_image(61))}}, "m"
        )
        prepared = rt.media.prepare(reference_prompt, [part], {})
        tokens, finish = _run(rt, GenerationRequest(tuple(prepared.ids), 4, media=prepared.payload))
        assert tokens == [] and finish.reason == "error"
        assert "position offset" in (finish.error or "")
        # text requests are unaffected
        text_ids = rt.tokenizer.encode("Hello there", add_special_tokens=False)
        tokens, finish = _run(rt, GenerationRequest(tuple(text_ids), 4))
        assert len(tokens) == 4 and finish.error is None
    finally:
        rt.engine.shutdown()


def test_qwen2_5_vl_image_and_video_through_the_engine(tmp_path: Path) -> None:
    """Qwen2.5-VL (windowed vision attention, time-aware M-RoPE for video) takes the
    same path as Qwen2-VL: token-identical to ``mlx_vlm.generate``."""
    path = build_test_vlm("qwen2_5_vl", seed=0)
    hooks, _ = _hooks()
    cfg = ServerConfig(model=str(path))
    hooks.configure(cfg)
    rt = build_runtime(cfg, hooks)
    try:
        reference = Reference(path)
        image = noise_image(71)
        clip = make_video(tmp_path / "clip.mp4", frames=8)
        cases = [
            ({"type": "image_url", "image_url": {"url": data_uri(image)}}, [image], []),
            ({"type": "video_url", "video_url": {"url": video_uri(clip)}}, [], [clip]),
        ]
        for part, images, videos in cases:
            expected, _ = reference.generate("Describe.", images, 8, videos)
            prompt = reference.prompt("Describe.", len(images), len(videos))
            prepared = rt.media.prepare(prompt, [MediaPart(part, "m")], {})
            request = GenerationRequest(tuple(prepared.ids), 8, media=prepared.payload)
            tokens, finish = _run(rt, request)
            assert finish.error is None
            assert tokens == expected
    finally:
        rt.engine.shutdown()


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_5"])
def test_text_requests_arriving_together_share_one_prefill(
    arch: str, request: pytest.FixtureRequest
) -> None:
    """Text requests on a VLM are prefilled in one batch (through the text view for
    Qwen2-VL, through mlx-lm's model for Qwen3.5) and stay identical to the reference:
    mlx-vlm's text-only output, or mlx-lm's on the Qwen3.5 checkpoint."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    runtime = request.getfixturevalue("runtime" if arch == "qwen2_vl" else "qwen3_5_runtime")
    reference = Reference(build_test_vlm(arch))
    texts = ["Tell me a story.", "List three colours, please.", "Hi"]
    prompts = [
        tuple(reference.tokenizer(reference.prompt(t, 0), add_special_tokens=False).input_ids)
        for t in texts
    ]
    before = runtime.engine.prefill.stats()["text_batches"]
    results = submit_together(runtime, [GenerationRequest(p, 12) for p in prompts])
    assert runtime.engine.prefill.stats()["text_batches"] == before + 1
    for text, prompt, result in zip(texts, prompts, results, strict=True):
        if arch == "qwen2_vl":
            expected = reference.generate_text_ids(text, 12)
        else:
            steps = stream_generate(
                runtime.model, runtime.tokenizer, list(prompt), 12, sampler=make_sampler(0.0)
            )
            expected = [s.token for s in steps]
        assert result.tokens == expected, text


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3"])
def test_a_media_prompt_starts_with_the_templates_own_special_tokens(arch: str) -> None:
    """One ``<bos>`` (or whatever the rendered template alone yields) at the start of an
    image prompt, for every family: mlx-vlm's tokenization used to add a second one to a
    Gemma 3 template that already starts with it."""
    reference = Reference(build_test_vlm(arch))
    prompt = reference.prompt("Describe.", 1)
    template = reference.tokenizer(prompt, add_special_tokens=False).input_ids
    handler = VisionMedia.from_config(reference.model, reference.processor, ServerConfig())
    part = MediaPart({"type": "image_url", "image_url": {"url": data_uri(noise_image(3))}}, "m")
    prepared = handler.prepare(prompt, [part], {})
    special = set(reference.tokenizer.all_special_ids)

    def leading_specials(ids: list[int]) -> list[int]:
        count = next((i for i, t in enumerate(ids) if t not in special), len(ids))
        return ids[:count]

    assert leading_specials(prepared.ids) == leading_specials(template)
    bos = reference.tokenizer.bos_token_id
    if bos is not None:
        assert prepared.ids.count(bos) == template.count(bos) <= 1
