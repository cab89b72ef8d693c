"""The `specprefill` plugin through mlxcore: flags, per-request options, the real
engine (continuous batching, usage, /metrics counters, no prefix reuse of a sparse
cache) and the fallback for unsupported targets."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler
from sp_helpers import masked_reference, prompt_ids

import mlxcore_specprefill as plugin
from mlxcore.cli.main import build_parser
from mlxcore.cli.options import config_from_args
from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime
from mlxcore.testing import make_runtime as make_test_runtime
from mlxcore_specprefill.sequential import SequentialStack


def hooks_with_plugin() -> PluginHooks:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("specprefill",), autoload=False))
    return PluginHooks(pm)


def make_runtime(model: Path, **options: Any) -> Runtime:
    return make_test_runtime(model, "specprefill", plugin_options=options, prefill_step_size=64)


def run(rt: Runtime, req: GenerationRequest) -> tuple[list[int], FinishEvent]:
    tokens: list[int] = []
    for event in rt.engine.stream(req):
        if isinstance(event, TokenEvent):
            tokens.extend(t.token for t in event.tokens)
        else:
            return tokens, event
    raise AssertionError("no finish event")


@pytest.fixture(scope="module")
def llama_rt(mlxcore_model_factory: Any) -> Any:
    rt = make_runtime(
        mlxcore_model_factory("llama"),
        specprefill_draft_model=str(mlxcore_model_factory("llama", seed=1)),
        specprefill_threshold=128,
        specprefill_keep=0.2,
        specprefill_chunk=16,
    )
    yield rt
    rt.engine.shutdown()


def test_engine_sparse_prefill_decodes_at_full_length_and_is_not_reused(llama_rt: Runtime) -> None:
    assert llama_rt.engine.prefill.name == "specprefill"
    prompt = prompt_ids(300)
    tokens, finish = run(llama_rt, GenerationRequest(prompt_tokens=prompt, max_tokens=6))
    assert finish.reason in ("length", "stop") and tokens
    kept = llama_rt.engine.prefill.last_kept  # type: ignore[attr-defined]
    assert finish.usage.extra == {"prompt_tokens_total": 300, "prompt_tokens_kept": len(kept)}
    assert len(kept) < 100
    # greedy tokens equal a dense model that sees only the kept prompt tokens, with
    # every generated token at its true position 300, 301, ...
    expected: list[int] = []
    for _ in tokens:
        seq = [*prompt, *expected]
        logits = masked_reference(llama_rt.model, seq, [*kept, *range(300, len(seq))])
        expected.append(int(mx.argmax(logits[-1]).item()))
    assert tokens == expected
    stats = llama_rt.engine.stats()
    assert stats["prefill_specprefill_applications"] >= 1
    assert stats["prefill_specprefill_tokens_kept"] >= len(kept)
    # the sparse cache was not stored: the same prompt, dense this time, reuses nothing
    dense = GenerationRequest(
        prompt_tokens=prompt, max_tokens=2, options={"specprefill": {"enabled": False}}
    )
    _, again = run(llama_rt, dense)
    assert again.usage.cached_tokens == 0 and again.usage.extra == {}


def test_batched_with_a_normal_request(llama_rt: Runtime) -> None:
    """A sparse sequence and a dense one decode in the same batch, both correctly."""
    short = GenerationRequest(prompt_tokens=prompt_ids(20, salt=3), max_tokens=12)
    long = GenerationRequest(prompt_tokens=prompt_ids(260, salt=5), max_tokens=12)
    results: dict[str, Any] = {}

    def worker(name: str, req: GenerationRequest) -> None:
        results[name] = run(llama_rt, req)

    threads = [threading.Thread(target=worker, args=a) for a in (("s", short), ("l", long))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    ref = [
        r.token
        for r in stream_generate(
            llama_rt.model,
            llama_rt.tokenizer,
            list(short.prompt_tokens),
            max_tokens=12,
            sampler=make_sampler(0.0),
        )
    ]
    tokens, finish = results["s"]
    assert tokens == ref[: len(tokens)] and finish.usage.extra == {}
    tokens, finish = results["l"]
    assert finish.usage.extra["prompt_tokens_kept"] < 260 and len(tokens) >= 1


def test_per_request_keep_one_matches_mlx_lm(llama_rt: Runtime) -> None:
    req = GenerationRequest(
        prompt_tokens=prompt_ids(200, salt=7), max_tokens=8, options={"specprefill": {"keep": 1}}
    )
    tokens, finish = run(llama_rt, req)
    assert finish.usage.extra == {"prompt_tokens_total": 200, "prompt_tokens_kept": 200}
    ref = [
        r.token
        for r in stream_generate(
            llama_rt.model,
            llama_rt.tokenizer,
            list(req.prompt_tokens),
            max_tokens=8,
            sampler=make_sampler(0.0),
        )
    ]
    assert tokens == ref[: len(tokens)]


def test_unsupported_target_falls_back_with_a_logged_reason(
    mlxcore_model_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("mlxcore.plugins.specprefill")
    logger.addHandler(caplog.handler)  # robust to "mlxcore" not propagating to root
    caplog.set_level(logging.WARNING, logger=logger.name)
    rt = make_runtime(
        mlxcore_model_factory("gemma4_text"),
        specprefill_draft_model=str(mlxcore_model_factory("llama", seed=1)),
    )
    logger.removeHandler(caplog.handler)
    try:
        assert rt.engine.prefill.name == "chunked"
        assert "is not supported, using normal prefill" in caplog.text
        assert "pre_feedforward_layernorm" in caplog.text
    finally:
        rt.engine.shutdown()


def _greedy(rt: Runtime, prompt: list[int], count: int) -> list[int]:
    sampler = make_sampler(0.0)
    steps = stream_generate(rt.model, rt.tokenizer, prompt, max_tokens=count, sampler=sampler)
    return [r.token for r in steps]


def test_gpt_oss_through_the_engine(mlxcore_model_factory: Any, gpt_oss_path: Path) -> None:
    """GPT-OSS (sliding-window layers in rotating caches, attention sinks) as target,
    the test Llama as draft: keep 1 is mlx-lm's greedy output; a sparse prefill keeps
    the last window and decodes."""
    rt = make_runtime(
        gpt_oss_path,
        specprefill_draft_model=str(mlxcore_model_factory("llama", seed=1)),
        specprefill_threshold=64,
        specprefill_chunk=16,
    )
    try:
        sp = rt.engine.prefill
        assert sp.name == "specprefill"
        prompt = prompt_ids(200, salt=9)
        whole = GenerationRequest(
            prompt_tokens=prompt, max_tokens=8, options={"specprefill": {"keep": 1.0}}
        )
        tokens, finish = run(rt, whole)
        assert finish.usage.extra == {"prompt_tokens_total": 200, "prompt_tokens_kept": 200}
        ref = _greedy(rt, list(prompt), 8)
        assert tokens == ref[: len(tokens)] and len(tokens) >= 1
        sparse = GenerationRequest(prompt_tokens=prompt_ids(200, salt=10), max_tokens=4)
        tokens, finish = run(rt, sparse)
        kept = sp.last_kept  # type: ignore[attr-defined]
        assert finish.usage.extra["prompt_tokens_kept"] == len(kept) < 100 and tokens
        assert set(range(192, 200)) <= set(kept)  # the 8-token window at the end
    finally:
        rt.engine.shutdown()


def test_nemotron_h_through_the_engine(mlxcore_model_factory: Any, nemotron_h_path: Path) -> None:
    """Nemotron-H (Mamba-2, attention without RoPE) as target, the test Llama as draft:
    keep 1 is mlx-lm's greedy output; a sparse prefill gives mlx-lm's greedy output for
    exactly the kept tokens, reports them in ``usage`` and is not stored for reuse."""
    rt = make_runtime(
        nemotron_h_path,
        specprefill_draft_model=str(mlxcore_model_factory("llama", seed=1)),
        specprefill_threshold=64,
        specprefill_chunk=16,
    )
    try:
        sp = rt.engine.prefill
        assert sp.name == "specprefill"
        assert isinstance(sp.target, SequentialStack)  # type: ignore[attr-defined]
        prompt = prompt_ids(200, salt=13)
        whole = GenerationRequest(
            prompt_tokens=prompt, max_tokens=6, options={"specprefill": {"keep": 1.0}}
        )
        tokens, finish = run(rt, whole)
        assert finish.usage.extra == {"prompt_tokens_total": 200, "prompt_tokens_kept": 200}
        assert tokens and tokens == _greedy(rt, list(prompt), 6)[: len(tokens)]
        long = prompt_ids(240, salt=14)
        tokens, finish = run(rt, GenerationRequest(prompt_tokens=long, max_tokens=6))
        kept = sp.last_kept  # type: ignore[attr-defined]
        assert finish.reason in ("length", "stop") and tokens
        assert finish.usage.extra == {"prompt_tokens_total": 240, "prompt_tokens_kept": len(kept)}
        assert len(kept) < 100 and kept[-1] == 239
        plain = _greedy(rt, [long[p] for p in kept], 6)
        assert tokens == plain[: len(tokens)]
        assert rt.engine.stats()["prefill_specprefill_applications"] >= 2
        # the sparse cache was not stored: a follow-up turn (prompt, answer, more) reuses
        # nothing, while the same follow-up of a dense request reuses its stored state
        # (recurrent caches are reused at exact stored boundaries only)
        off = {"specprefill": {"enabled": False}}
        extra = list(prompt_ids(20, salt=15))
        _, after_sparse = run(
            rt, GenerationRequest(prompt_tokens=(*long, *tokens, *extra), max_tokens=2, options=off)
        )
        assert after_sparse.usage.cached_tokens == 0 and after_sparse.usage.extra == {}
        answer, _ = run(rt, GenerationRequest(prompt_tokens=long, max_tokens=6, options=off))
        _, after_dense = run(
            rt, GenerationRequest(prompt_tokens=(*long, *answer, *extra), max_tokens=2, options=off)
        )
        assert after_dense.usage.cached_tokens > len(long) // 2
    finally:
        rt.engine.shutdown()


def test_nemotron_h_draft_is_refused(mlxcore_model_factory: Any, nemotron_h_path: Path) -> None:
    """Scoring reads attention through the composed layers: a Nemotron-H draft stops
    start-up with the reason (it can only be a target)."""
    with pytest.raises(UsageError, match=r"cannot be used as a draft: .*a target only"):
        make_runtime(mlxcore_model_factory("llama"), specprefill_draft_model=str(nemotron_h_path))


def test_configure_requires_a_draft_and_valid_flags() -> None:
    hooks = hooks_with_plugin()
    with pytest.raises(UsageError, match="--specprefill-draft-model"):
        hooks.configure(ServerConfig(model="m"))
    hooks.configure(ServerConfig(model="m", plugin_options={"specprefill_enabled": False}))
    bad = {"specprefill_draft_model": "d", "specprefill_keep": 1.5}
    with pytest.raises(UsageError, match="--specprefill-keep"):
        hooks.configure(ServerConfig(model="m", plugin_options=bad))


def test_flags_parse_into_plugin_options() -> None:
    parser, core = build_parser(hooks_with_plugin())
    flags = ["--specprefill-draft-model", "d", "--specprefill-keep", "0.3"]
    flags += ["--specprefill-threshold", "4096", "--specprefill-chunk", "64"]
    args = parser.parse_args(["serve", "m", *flags])
    cfg = config_from_args(args, core)
    assert cfg.option("specprefill_draft_model") == "d"
    assert cfg.option("specprefill_keep") == 0.3
    assert cfg.option("specprefill_threshold") == 4096
    assert cfg.option("specprefill_chunk") == 64
    assert cfg.option("specprefill_enabled") is True


CONFIG = ServerConfig(model="m", plugin_options={"specprefill_draft_model": "d"})


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"keep": 0}, "specprefill.keep"),
        ({"keep": 1.01}, "specprefill.keep"),
        ({"keep": "0.2"}, "specprefill.keep"),
        ({"keep": True}, "specprefill.keep"),
        ({"threshold": -1}, "specprefill.threshold"),
        ({"threshold": 1.5}, "specprefill.threshold"),
        ({"chunk": 0}, "specprefill.chunk"),
        ({"enabled": "yes"}, "specprefill.enabled"),
        ({"draft_model": "x"}, "specprefill.draft_model"),
        ("on", "specprefill"),
    ],
)
def test_validate_options_rejects_bad_values(value: Any, field: str) -> None:
    with pytest.raises(ValueError) as info:
        plugin.mlxcore_validate_options({"specprefill": value}, CONFIG)
    assert info.value.args[0] == field and isinstance(info.value.args[1], str)


@pytest.mark.parametrize(
    "value",
    [None, True, False, {}, {"keep": 0.5, "threshold": 0, "chunk": 8, "enabled": True}],
)
def test_validate_options_accepts_good_values(value: Any) -> None:
    options = {} if value is None else {"specprefill": value}
    plugin.mlxcore_validate_options({**options, "other_plugin_field": 1}, CONFIG)


def test_validate_options_without_a_draft() -> None:
    off = ServerConfig(model="m", plugin_options={"specprefill_enabled": False})
    plugin.mlxcore_validate_options({"specprefill": {"keep": 0.5}}, off)
    with pytest.raises(ValueError) as info:
        plugin.mlxcore_validate_options({"specprefill": True}, off)
    assert info.value.args[0] == "specprefill.enabled"
