"""The engine on real tiny models: greedy identity with mlx-lm, batching, prefix
reuse, seeds, limits, cancellation, fault isolation, and the strategy hooks."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.testing import make_runtime

PROMPTS = [
    "The quick brown fox",
    "Once upon a time in a land far away",
    "def fibonacci(n):",
    "Paris is the capital of",
    "1, 2, 3, 4,",
    "The meaning of life is",
    "Roses are red, violets are",
    "In the beginning",
]


@pytest.fixture(scope="module")
def llama_rt(tiny_llama: Path):
    rt = make_runtime(tiny_llama)
    yield rt
    rt.engine.shutdown()


def reference_tokens(rt: Runtime, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens from mlx-lm's own generator: the ground truth."""
    out = []
    sampler = make_sampler(0.0)
    for resp in stream_generate(rt.model, rt.tokenizer, prompt, max_tokens=n, sampler=sampler):
        out.append(resp.token)
    return out


def run(rt: Runtime, request: GenerationRequest) -> tuple[list[int], FinishEvent]:
    tokens: list[int] = []
    for event in rt.engine.stream(request):
        if isinstance(event, TokenEvent):
            tokens.extend(t.token for t in event.tokens)
        else:
            return tokens, event
    raise AssertionError("stream ended without a finish event")


def run_many(rt: Runtime, requests: list[GenerationRequest]) -> list[tuple[list[int], FinishEvent]]:
    results: list[tuple[list[int], FinishEvent] | None] = [None] * len(requests)
    done = threading.Barrier(len(requests) + 1)

    def worker(i: int) -> None:
        results[i] = run(rt, requests[i])
        done.wait()

    for i in range(len(requests)):
        threading.Thread(target=worker, args=(i,), daemon=True).start()
    done.wait(timeout=300)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def ids(rt: Runtime, text: str) -> tuple[int, ...]:
    return tuple(rt.tokenizer.encode(text))


def greedy(rt: Runtime, text: str, n: int = 24) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=ids(rt, text), max_tokens=n)


def test_greedy_matches_mlx_lm_alone(llama_rt: Runtime) -> None:
    req = greedy(llama_rt, PROMPTS[0], 32)
    tokens, finish = run(llama_rt, req)
    expected = reference_tokens(llama_rt, list(req.prompt_tokens), 32)
    assert tokens == expected[: len(tokens)]
    assert finish.reason in ("length", "stop")
    assert finish.usage.prompt_tokens == len(req.prompt_tokens)
    assert finish.usage.completion_tokens == len(tokens)


def test_greedy_matches_mlx_lm_in_a_batch_of_eight(llama_rt: Runtime) -> None:
    requests = [greedy(llama_rt, p, 24) for p in PROMPTS]
    results = run_many(llama_rt, requests)
    for req, (tokens, finish) in zip(requests, results, strict=True):
        assert finish.reason in ("length", "stop")
        expected = reference_tokens(llama_rt, list(req.prompt_tokens), 24)
        assert tokens == expected[: len(tokens)], f"batched output diverged for {req.prompt_tokens}"


def test_prefix_reuse_gives_same_tokens_and_reports_cached(tiny_qwen3: Path) -> None:
    rt = make_runtime(tiny_qwen3)
    try:
        long_prefix = " ".join(f"word{i}" for i in range(200))
        first = greedy(rt, long_prefix + " first question", 8)
        _, f1 = run(rt, first)
        assert f1.usage.cached_tokens == 0
        follow = greedy(rt, long_prefix + " second question", 16)
        tokens, f2 = run(rt, follow)
        assert f2.usage.cached_tokens >= len(ids(rt, long_prefix)) - 2
        assert tokens == reference_tokens(rt, list(follow.prompt_tokens), 16)[: len(tokens)]
        assert rt.engine.stats()["prefix_cache_hits"] >= 1
    finally:
        rt.engine.shutdown()


def test_hybrid_model_reuses_only_exact_boundaries(tiny_qwen3_5: Path) -> None:
    rt = make_runtime(tiny_qwen3_5)
    try:
        turn1 = greedy(rt, "System prompt with some length. User: hello there", 6)
        t1, _ = run(rt, turn1)
        # the next turn extends everything the first one held (prompt + output)
        follow_ids = (*turn1.prompt_tokens, *t1, *ids(rt, " User: and again"))
        follow = GenerationRequest(prompt_tokens=follow_ids, max_tokens=8)
        tokens, f2 = run(rt, follow)
        assert f2.usage.cached_tokens > 0
        assert tokens == reference_tokens(rt, list(follow_ids), 8)[: len(tokens)]
        # a prompt that diverges inside the stored one cannot rewind recurrent state
        other = greedy(rt, "System prompt with some length. User: goodbye", 4)
        _, f3 = run(rt, other)
        assert f3.usage.cached_tokens == 0
    finally:
        rt.engine.shutdown()


def test_same_seed_same_output_and_max_tokens(llama_rt: Runtime) -> None:
    def sampled(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=seed)
        return run(llama_rt, GenerationRequest(ids(llama_rt, PROMPTS[1]), 20, params))[0]

    a, b, c = sampled(7), sampled(7), sampled(8)
    assert a == b
    assert a != c
    assert len(a) <= 20


def test_seeded_request_is_stable_inside_a_batch(llama_rt: Runtime) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=123)
    alone = run(llama_rt, GenerationRequest(ids(llama_rt, PROMPTS[2]), 16, params))[0]
    others = [greedy(llama_rt, p, 16) for p in PROMPTS[3:7]]
    batch = run_many(llama_rt, [GenerationRequest(ids(llama_rt, PROMPTS[2]), 16, params), *others])
    assert batch[0][0] == alone


def test_cancel_stops_the_request(llama_rt: Runtime) -> None:
    events: list[object] = []
    finished = threading.Event()

    def sink(event: object) -> None:
        events.append(event)
        if isinstance(event, FinishEvent):
            finished.set()

    handle = llama_rt.engine.submit(greedy(llama_rt, PROMPTS[0], 30_000), sink)
    while not any(isinstance(e, TokenEvent) for e in events):
        finished.wait(0.01)
    handle.cancel()
    assert finished.wait(30)
    last = events[-1]
    assert isinstance(last, FinishEvent) and last.reason == "cancelled"
    assert llama_rt.engine.stats()["requests_running"] == 0


def write_plugin(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


HOOKED = """
    import mlx.core as mx
    from mlxcore.defaults.decoder import PlainDecoder
    from mlxcore.defaults.prefix_cache import LRUPrefixCache

    FORCED = 42

    class CountingDecoder(PlainDecoder):
        name = "counting"
        steps = 0
        def step(self):
            CountingDecoder.steps += 1
            return super().step()

    class MyCache(LRUPrefixCache):
        name = "my-cache"

    def mlxcore_patch_model(model, info, config):
        model.patched_by_test = info.model_type

    def mlxcore_decoder(model, info, config):
        return CountingDecoder(model)

    def mlxcore_cache_strategy(model, info, config):
        return MyCache(model, size="1000")

    def mlxcore_logits_processors(request, info):
        mode = request.options.get("test_mode")
        if mode == "force":
            def force(tokens, logits):
                return logits.at[:, FORCED].add(1e9)
            return [force]
        if mode == "explode":
            def explode(tokens, logits):
                raise RuntimeError("processor blew up")
            return [explode]
        return None
"""


@pytest.fixture
def hooked_rt(tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = write_plugin(tmp_path, "hooked_plugin", HOOKED)
    rt = make_runtime(tiny_llama, name)
    yield rt
    rt.engine.shutdown()


def test_strategy_hooks_are_used(hooked_rt: Runtime) -> None:
    assert hooked_rt.model.patched_by_test == "llama"  # mlxcore_patch_model ran
    assert hooked_rt.engine.decoder.name == "counting"  # mlxcore_decoder
    assert hooked_rt.engine.cache.name == "my-cache"  # mlxcore_cache_strategy
    assert hooked_rt.engine.prefill.name == "chunked"  # built-in default
    before = type(hooked_rt.engine.decoder).steps
    run(hooked_rt, greedy(hooked_rt, PROMPTS[0], 5))
    assert type(hooked_rt.engine.decoder).steps > before


def test_logits_processor_hook_applies_per_request(hooked_rt: Runtime) -> None:
    forced = GenerationRequest(ids(hooked_rt, PROMPTS[0]), 6, options={"test_mode": "force"})
    plain = greedy(hooked_rt, PROMPTS[0], 6)
    (t_forced, _), (t_plain, _) = run_many(hooked_rt, [forced, plain])
    assert t_forced == [42] * 6
    assert t_plain == reference_tokens(hooked_rt, list(plain.prompt_tokens), 6)[: len(t_plain)]


def test_a_failing_request_does_not_fail_the_batch(hooked_rt: Runtime) -> None:
    bad = GenerationRequest(ids(hooked_rt, PROMPTS[1]), 8, options={"test_mode": "explode"})
    good = [greedy(hooked_rt, p, 8) for p in PROMPTS[2:5]]
    results = run_many(hooked_rt, [bad, *good])
    assert results[0][1].reason == "error"
    assert "processor blew up" in (results[0][1].error or "")
    for req, (tokens, finish) in zip(good, results[1:], strict=True):
        assert finish.reason in ("length", "stop")
        assert tokens == reference_tokens(hooked_rt, list(req.prompt_tokens), 8)[: len(tokens)]
    # and the engine keeps serving
    assert run(hooked_rt, greedy(hooked_rt, PROMPTS[0], 3))[1].reason in ("length", "stop")


def test_prompt_longer_than_context_is_rejected(tiny_llama: Path) -> None:
    from mlxcore.engine.engine import RequestRejected

    rt = make_runtime(tiny_llama, max_model_len=64)
    try:
        with pytest.raises(RequestRejected, match="context length"):
            rt.engine.submit(GenerationRequest(tuple(range(60)), 10), lambda e: None)
    finally:
        rt.engine.shutdown()


def test_mx_is_not_touched_by_the_caller_thread(llama_rt: Runtime) -> None:
    # the engine runs generation on its own stream; the default stream stays usable here
    assert mx.array([1, 2]).sum().item() == 3


def test_request_that_cannot_fit_in_memory_is_rejected(tiny_llama: Path) -> None:
    from mlxcore.engine.engine import RequestRejected

    rt = make_runtime(tiny_llama, max_model_len=10**12)  # only memory limits the context
    try:
        fits = rt.engine.memory.max_context()
        assert fits is not None and fits > 1000
        with pytest.raises(RequestRejected, match="memory"):
            rt.engine.submit(GenerationRequest((1, 2, 3), fits + 10), lambda e: None)
    finally:
        rt.engine.shutdown()


def test_scripted_test_plugin_makes_a_real_model_write_text(tiny_qwen3: Path) -> None:
    rt = make_runtime(tiny_qwen3, "mlxcore.testing.scripted")
    try:
        script = "<think>plan</think>Sure: 42"
        req = GenerationRequest(ids(rt, "hello"), 50, options={"test_script": script})
        tokens, finish = run(rt, req)
        assert finish.reason == "stop"
        assert rt.tokenizer.decode(tokens[:-1]) == script
        assert tokens[-1] in rt.info.eos_token_ids
    finally:
        rt.engine.shutdown()


def test_hybrid_multi_turn_chat_reuses_the_history_snapshot(tiny_qwen3_5: Path) -> None:
    from mlxcore.prompts import render_chat

    rt = make_runtime(tiny_qwen3_5)
    try:
        history = [
            {"role": "system", "content": "You are terse. " * 30},
            {"role": "user", "content": "Name a colour."},
        ]
        first = render_chat(rt.tokenizer, history)
        assert first.history_length is not None
        req1 = GenerationRequest(tuple(first.ids), 6, checkpoints=first.checkpoints())
        out1, _ = run(rt, req1)
        reply = rt.tokenizer.decode([t for t in out1 if t not in rt.info.eos_token_ids])
        history += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "Another."},
        ]
        second = render_chat(rt.tokenizer, history)
        req2 = GenerationRequest(tuple(second.ids), 8, checkpoints=second.checkpoints())
        out2, f2 = run(rt, req2)
        # the generation prompt re-renders differently, but the history snapshot is a prefix
        assert f2.usage.cached_tokens >= first.history_length
        assert out2 == reference_tokens(rt, second.ids, 8)[: len(out2)]
    finally:
        rt.engine.shutdown()


def test_hybrid_agent_turns_keep_the_history_checkpoint_under_a_tight_budget(
    tiny_qwen3_5: Path,
) -> None:
    """An agent's turn stores two snapshots: at the history checkpoint (the next turn
    starts there) and at the end of the finished sequence (a recurrent cache cannot be cut
    back, so for a hybrid model it rarely helps). When the budget holds only one, the
    checkpoint stays."""
    from mlxcore.engine.memory import cache_cost
    from mlxcore.prompts import render_chat

    history = [{"role": "user", "content": " ".join(f"fact{i}" for i in range(150))}]
    probe = make_runtime(tiny_qwen3_5)
    try:
        turn1 = render_chat(probe.tokenizer, history)
        request = GenerationRequest(
            prompt_tokens=tuple(turn1.ids), checkpoints=turn1.checkpoints(), max_tokens=4
        )
        run(probe, request)
        pair = probe.engine.stats()["prefix_cache_bytes"]
        budget = pair - cache_cost(probe.model)[1] // 2  # one snapshot does not fit
    finally:
        probe.engine.shutdown()
    rt = make_runtime(tiny_qwen3_5, prefix_cache_size=f"{budget}b")
    try:
        tokens, _ = run(rt, request)
        assert 0 < rt.engine.stats()["prefix_cache_bytes"] <= budget
        assert rt.engine.stats()["prefix_cache_snapshots"] == 1
        reply = rt.tokenizer.decode(tokens)
        turn2 = render_chat(
            rt.tokenizer,
            [*history, {"role": "assistant", "content": reply}, {"role": "user", "content": "ok?"}],
        )
        assert turn2.ids[: turn1.history_length] == turn1.ids[: turn1.history_length]
        follow = GenerationRequest(prompt_tokens=tuple(turn2.ids), max_tokens=4)
        _, finish = run(rt, follow)
        assert finish.usage.cached_tokens == turn1.history_length
    finally:
        rt.engine.shutdown()


def test_a_token_budget_holds_that_much_history_of_a_hybrid_model(tiny_qwen3_5: Path) -> None:
    """``--prefix-cache-size N`` (tokens) holds a conversation of N tokens even though each
    entry of a hybrid model also carries its recurrent layers' fixed state."""
    from mlxcore.prompts import render_chat

    history = [{"role": "user", "content": " ".join(f"note{i}" for i in range(120))}]
    probe = make_runtime(tiny_qwen3_5)
    turn1 = render_chat(probe.tokenizer, history)
    probe.engine.shutdown()
    assert turn1.history_length is not None
    rt = make_runtime(tiny_qwen3_5, prefix_cache_size=str(turn1.history_length + 8))
    try:
        request = GenerationRequest(
            prompt_tokens=tuple(turn1.ids), checkpoints=turn1.checkpoints(), max_tokens=2
        )
        run(rt, request)
        turn2 = render_chat(rt.tokenizer, [*history, {"role": "user", "content": "and?"}])
        _, finish = run(rt, GenerationRequest(prompt_tokens=tuple(turn2.ids), max_tokens=2))
        assert finish.usage.cached_tokens == turn1.history_length
    finally:
        rt.engine.shutdown()
