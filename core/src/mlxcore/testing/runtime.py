"""An in-process runtime for engine-level tests: the real loader, engine and strategies."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxcore.engine.events import FinishEvent
    from mlxcore.engine.request import GenerationRequest
    from mlxcore.runtime import Runtime


def make_runtime(
    model: Path | str,
    *plugins: str,
    plugin_options: dict[str, Any] | None = None,
    **config: Any,
) -> Runtime:
    """Load ``model`` with the built-ins and only the ``plugins`` named (no autoloading),
    configured like ``mlxcore serve`` would be: ``config`` sets :class:`ServerConfig`
    fields, ``plugin_options`` the plugins' own flags. Call ``runtime.engine.shutdown()``
    when done."""
    from mlxcore.config import ServerConfig
    from mlxcore.hooks import PluginHooks
    from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
    from mlxcore.runtime import build_runtime

    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=plugins, autoload=False))
    hooks = PluginHooks(pm)
    cfg = ServerConfig(model=str(model), plugin_options=plugin_options or {}, **config)
    hooks.configure(cfg)
    return build_runtime(cfg, hooks)


class Result:
    """What one request received through its sink: tokens, the finish event."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finish: FinishEvent | None = None
        self.done = threading.Event()

    def sink(self, event: object) -> None:
        """The engine's event sink for this request."""
        from mlxcore.engine.events import FinishEvent, TokenEvent

        if isinstance(event, TokenEvent):
            self.tokens.extend(t.token for t in event.tokens)
        elif isinstance(event, FinishEvent):
            self.finish = event
            self.done.set()


def submit_together(
    rt: Runtime, requests: Sequence[GenerationRequest], timeout: float = 120.0
) -> list[Result]:
    """Submit ``requests`` so that the engine admits them in one loop iteration (its
    thread waits on the queue's lock while they go in: what batched prefill needs to
    see), and wait until every one has finished."""
    results = [Result() for _ in requests]
    with rt.engine._wake:
        for request, result in zip(requests, results, strict=True):
            rt.engine.submit(request, result.sink)
    for result in results:
        if not result.done.wait(timeout):
            raise TimeoutError("a request never finished")
    return results


def reference_tokens(
    rt: Runtime, prompt: Sequence[int], n: int, **generate_kwargs: Any
) -> list[int]:
    """Greedy tokens from mlx-lm's own ``stream_generate``: the ground truth
    (``generate_kwargs``: e.g. ``kv_bits=8, quantized_kv_start=0``)."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(0.0)
    return [
        r.token
        for r in stream_generate(
            rt.model, rt.tokenizer, list(prompt), n, sampler=sampler, **generate_kwargs
        )
    ]


def assert_matches_mlx_lm(
    rt: Runtime, request: GenerationRequest, result: Result, **generate_kwargs: Any
) -> None:
    """Assert that a greedy request finished normally with mlx-lm's tokens and usage
    (``generate_kwargs``: passed to mlx-lm, see :func:`reference_tokens`)."""
    finish = result.finish
    assert finish is not None and finish.reason in ("length", "stop"), finish
    expected = reference_tokens(rt, request.prompt_tokens, request.max_tokens, **generate_kwargs)
    assert result.tokens == expected[: len(result.tokens)], (
        f"diverged for a prompt of {len(request.prompt_tokens)} tokens"
    )
    assert finish.usage.prompt_tokens == len(request.prompt_tokens)
    assert finish.usage.completion_tokens == len(result.tokens)


def assert_structured_same_on_off(rt: Runtime, prompt_text: str) -> None:
    """A JSON-schema constraint gives the same valid output with speculation on and off
    (the constrained-decoding processor sees every verified token, in order)."""
    import json

    from mlxcore.engine.request import GenerationRequest
    from mlxcore.structured import OPTION, from_response_format

    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 6}},
        "required": ["tags"],
        "additionalProperties": False,
    }
    constraint = from_response_format(
        {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
    )
    prompt = tuple(rt.tokenizer.encode(prompt_text))
    texts = []
    for speculative in (True, False):
        options = {OPTION: constraint, "speculative": speculative}
        (res,) = submit_together(rt, [GenerationRequest(prompt, 64, options=options)])
        assert res.finish is not None and res.finish.reason == "stop", res.finish
        kept = [t for t in res.tokens if t not in rt.info.eos_token_ids]
        texts.append(rt.tokenizer.decode(kept))
    assert texts[0] == texts[1]
    assert set(json.loads(texts[0])) == {"tags"}


def assert_thinking_budget_same_on_off(rt: Runtime, prompt_text: str, budget: int = 6) -> None:
    """A thinking budget closes the think block at the same token with speculation on
    and off (the budget's processor counts only verified tokens, and starts over when a
    rejected draft shortens the context)."""
    from mlxcore.engine.request import GenerationRequest, SamplingParams
    from mlxcore.thinking import OPTION, ThinkingBudget

    markers = rt.thinking_markers()
    assert markers is not None, "the model needs a tag-based reasoning parser"
    prompt = tuple(rt.tokenizer.encode(prompt_text))
    outputs = []
    for speculative in (True, False):
        plan = ThinkingBudget(budget, markers, starts_inside=True)
        request = GenerationRequest(
            prompt,
            budget + 16,
            SamplingParams(ignore_eos=True),
            options={OPTION: plan, "speculative": speculative},
        )
        (res,) = submit_together(rt, [request])
        assert res.finish is not None and res.finish.reason == "length", res.finish
        outputs.append(res.tokens)
    assert outputs[0] == outputs[1]
    forced = list(markers.forced_close)
    assert outputs[0][budget : budget + len(forced)] == forced, outputs[0]


def after_each_step(rt: Runtime, read: Callable[[Any], Any]) -> list[Any]:
    """A list that gets ``read(decoder)`` after each decode step of ``rt``'s current
    decoder (wraps that decoder instance's ``step``; nothing else is patched)."""
    decoder: Any = rt.engine._loop.decoder
    seen: list[Any] = []
    step = decoder.step

    def recorded() -> Any:
        out = step()
        seen.append(read(decoder))
        return out

    decoder.step = recorded
    return seen
