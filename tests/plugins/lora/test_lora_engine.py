"""LoRA adapters through the real engine on the tiny Qwen3 (and the Qwen3.5 hybrid): three
adapters of different ranks, layers and scales plus the base model in one batch give, row
by row, exactly mlx-lm's greedy tokens for that adapter (``mlx_lm.load(adapter_path=...)``);
batched prefill, chunked prefill and rows joining a running batch included; the prefix
cache never hands one adapter's state to another; bad folders stop start-up with the
reason; a queued request whose adapter was unloaded ends as unavailable."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxcore.config import ServerConfig
from mlxcore.engine.adapters import adapter_request, adapters_of
from mlxcore.engine.events import UNAVAILABLE
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.errors import UsageError
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import Result, make_runtime, submit_together
from mlxcore_lora import mlxcore_configure
from mlxcore_lora.bank import AdapterBank
from mlxcore_lora.folder import AdapterError, read_adapter
from mlxcore_lora.testing import write_adapter

pytestmark = pytest.mark.xdist_group("lora")

TOKENS = 20
SHAPES: dict[str, dict[str, Any]] = {
    "all": {"rank": 8, "scale": 10.0, "seed": 1},
    "sparse": {
        "rank": 4,
        "scale": 20.0,
        "num_layers": 1,
        "keys": ["self_attn.q_proj", "mlp.down_proj"],
        "seed": 2,
    },
    "values": {"rank": 16, "scale": 5.0, "keys": ["self_attn.v_proj"], "seed": 3},
}


def build_adapters(model: Path, root: Path) -> dict[str, Path]:
    return {name: write_adapter(model, root / name, **shape) for name, shape in SHAPES.items()}


@pytest.fixture(scope="module")
def qwen_adapters(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_adapters(tiny_qwen3, tmp_path_factory.mktemp("qwen3-adapters"))


@pytest.fixture
def runtimes() -> Iterator[Any]:
    made: list[Runtime] = []

    def make(model: Path, adapters: dict[str, Path], *plugins: str, **config: Any) -> Runtime:
        specs = [f"{name}={path}" for name, path in adapters.items()]
        made.append(make_runtime(model, "lora", *plugins, plugin_options={"lora": specs}, **config))
        return made[-1]

    yield make
    for rt in made:
        rt.engine.shutdown()


class References:
    """mlx-lm's own greedy tokens, per adapter (one mlx-lm model each, loaded once)."""

    def __init__(self, model: Path, adapters: dict[str, Path]) -> None:
        from mlx_lm.utils import load

        self.models = {
            name: load(str(model), adapter_path=str(path))[0] for name, path in adapters.items()
        }
        self.models[None], self.tokenizer = load(str(model))
        self._seen: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}

    def tokens(self, adapter: str | None, prompt: tuple[int, ...]) -> list[int]:
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        if (adapter, prompt) not in self._seen:
            model = self.models[adapter]
            steps = stream_generate(
                model, self.tokenizer, list(prompt), TOKENS, sampler=make_sampler(0.0)
            )
            self._seen[adapter, prompt] = [step.token for step in steps]
        return self._seen[adapter, prompt]


@pytest.fixture(scope="module")
def qwen_refs(tiny_qwen3: Path, qwen_adapters: dict[str, Path]) -> References:
    return References(tiny_qwen3, qwen_adapters)


def request(
    rt: Runtime, adapter: str | None, prompt: tuple[int, ...], **kw: Any
) -> GenerationRequest:
    plain = GenerationRequest(prompt_tokens=prompt, max_tokens=kw.pop("max_tokens", TOKENS), **kw)
    bank = adapters_of(rt.model)
    assert bank is not None
    key = None if adapter is None else bank.key(adapter)
    return plain if adapter is None else adapter_request(plain, key)  # type: ignore[arg-type]


def prompts(seed: int, count: int, low: int = 6, high: int = 30) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [
        tuple(rng.randrange(300, 3000) for _ in range(rng.randrange(low, high)))
        for _ in range(count)
    ]


def assert_rows_match(
    refs: References, names: list[str | None], asked: list[tuple[int, ...]], results: list[Result]
) -> None:
    changed = 0
    for name, prompt, result in zip(names, asked, results, strict=True):
        assert result.finish is not None and result.finish.reason == "length", result.finish
        assert result.tokens == refs.tokens(name, prompt), f"adapter {name}: not mlx-lm's tokens"
        if name is not None:
            changed += result.tokens != refs.tokens(None, prompt)
    adapted = sum(name is not None for name in names)
    assert changed >= adapted - 1, "the adapters hardly change the output: the test could not fail"


def test_mixed_batch_matches_mlx_lm_per_adapter(
    runtimes: Any, tiny_qwen3: Path, qwen_adapters: dict[str, Path], qwen_refs: References
) -> None:
    rt = runtimes(tiny_qwen3, qwen_adapters)
    refs = qwen_refs
    names: list[str | None] = ["all", "sparse", "values", None, "all", "sparse", None, "values"]
    asked = prompts(1, len(names))
    results = submit_together(rt, [request(rt, n, p) for n, p in zip(names, asked, strict=True)])
    assert rt.engine.prefill.stats()["batched_requests"] >= 2  # the prefill ran batched too
    assert_rows_match(refs, names, asked, results)


@pytest.mark.long
def test_chunked_prefill_and_rows_joining_a_running_batch(
    runtimes: Any, tiny_qwen3: Path, qwen_adapters: dict[str, Path], qwen_refs: References
) -> None:
    rt = runtimes(tiny_qwen3, qwen_adapters, prefill_step_size=16)
    refs = qwen_refs
    names: list[str | None] = ["values", None, "all", "sparse", "all", None]
    asked = prompts(2, len(names), low=40, high=90)  # several chunks each
    results = [Result() for _ in names]
    for i, (name, prompt) in enumerate(zip(names, asked, strict=True)):
        rt.engine.submit(request(rt, name, prompt, max_tokens=TOKENS), results[i].sink)
        if i % 2 == 0:  # the next row joins while this one decodes
            while not results[i].tokens and not results[i].done.is_set():
                threading.Event().wait(0.005)
    for result in results:
        assert result.done.wait(120)
    assert_rows_match(refs, names, asked, results)


def test_prefix_cache_keeps_adapters_apart(
    runtimes: Any, tiny_qwen3: Path, qwen_adapters: dict[str, Path], qwen_refs: References
) -> None:
    rt = runtimes(tiny_qwen3, qwen_adapters)
    refs = qwen_refs
    prompt = prompts(3, 1, low=60, high=61)[0]
    order: list[str | None] = ["all", None, "sparse", "all", None]
    cached = []
    for name in order:
        [result] = submit_together(rt, [request(rt, name, prompt)])
        assert result.tokens == refs.tokens(name, prompt), name
        assert result.finish is not None
        cached.append(result.finish.usage.cached_tokens)
    # first use of each adapter (and of the base) reads nothing; a second use reads its own
    assert cached[:3] == [0, 0, 0], cached
    assert cached[3] > 0 and cached[4] > 0, cached


def test_sampled_rows_sample_from_their_adapter(
    runtimes: Any, tiny_qwen3: Path, qwen_adapters: dict[str, Path], qwen_refs: References
) -> None:
    """The sampling path (normalised log-probabilities, one sampler per row) runs each row
    under its adapter: at a temperature this low a sample is the argmax unless two logits
    lie within ~1e-2, so each row gives mlx-lm's greedy tokens for its adapter."""
    rt = runtimes(tiny_qwen3, qwen_adapters)
    sampling = SamplingParams(temperature=1e-4, seed=7)
    names: list[str | None] = ["sparse", None, "all", "values"]
    asked = prompts(4, len(names))
    results = submit_together(
        rt, [request(rt, n, p, sampling=sampling) for n, p in zip(names, asked, strict=True)]
    )
    assert_rows_match(qwen_refs, names, asked, results)


@pytest.mark.long
def test_qwen3_5_hybrid_matches_mlx_lm(runtimes: Any, tiny_qwen3_5: Path, tmp_path: Path) -> None:
    adapters = {
        "attn": write_adapter(tiny_qwen3_5, tmp_path / "attn", rank=8, seed=4),
        "mlp": write_adapter(
            tiny_qwen3_5, tmp_path / "mlp", rank=4, keys=["mlp.down_proj"], seed=5
        ),
    }
    rt = runtimes(tiny_qwen3_5, adapters)
    refs = References(tiny_qwen3_5, adapters)
    names: list[str | None] = ["attn", None, "mlp", "attn"]
    asked = prompts(5, len(names))
    results = submit_together(rt, [request(rt, n, p) for n, p in zip(names, asked, strict=True)])
    assert_rows_match(refs, names, asked, results)


def test_unloaded_adapter_ends_queued_requests_and_frees_bytes(
    runtimes: Any, tiny_qwen3: Path, qwen_adapters: dict[str, Path]
) -> None:
    rt = runtimes(tiny_qwen3, qwen_adapters)
    bank = adapters_of(rt.model)
    assert isinstance(bank, AdapterBank)
    before = bank.nbytes
    queued = request(rt, "values", prompts(6, 1)[0])
    removed = bank.remove("values")
    assert bank.nbytes == before - removed.nbytes and "values" not in bank.names()
    [result] = submit_together(rt, [queued])
    assert result.finish is not None and result.finish.reason == "error"
    assert result.finish.code == UNAVAILABLE and "unloaded" in (result.finish.error or "")
    [still] = submit_together(rt, [request(rt, "all", prompts(6, 1)[0])])
    assert still.finish is not None and still.finish.reason == "length"
    # installed again (a new key): served, and the old requests' key stays unknown
    key = bank.install(read_adapter("values", qwen_adapters["values"], bank.targets))
    assert key != queued.options["adapter"] and bank.key("values") == key


def test_speculative_decoder_is_refused(tiny_qwen3: Path, qwen_adapters: dict[str, Path]) -> None:
    specs = [f"all={qwen_adapters['all']}"]
    with pytest.raises(UsageError, match="does not run adapters per row"):
        make_runtime(tiny_qwen3, "lora", "prompt-lookup", plugin_options={"lora": specs})


def _broken(root: Path, good: Path, name: str) -> Path:
    """A copy of ``good`` broken in the way ``name`` says."""
    folder = root / name
    folder.mkdir()
    config = json.loads((good / "adapter_config.json").read_text())
    weights = mx.load(str(good / "adapters.safetensors"))
    first = next(iter(sorted(weights)))
    if name == "dora":
        config["fine_tune_type"] = "dora"
    elif name == "no-scale":
        config["lora_parameters"] = {"rank": 8, "alpha": 16}
    elif name == "unknown-layer":
        weights["model.layers.0.nowhere.lora_a"] = weights[first]
    elif name == "wrong-shape":
        weights[first] = mx.zeros((3, 3))
    elif name == "nan":
        weights[first] = weights[first] * mx.array(float("nan"))
    elif name == "half-pair":
        weights.pop(first)
    if name != "no-weights":
        mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    if name != "no-config":
        (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("dora", "fine_tune_type 'dora'"),
        ("no-scale", "scale must be a number"),
        ("unknown-layer", "is not a linear layer of this model"),
        ("wrong-shape", "this model's layer needs"),
        ("nan", "NaN or infinite"),
        ("half-pair", "needs both lora_a and lora_b"),
        ("no-weights", "no adapters.safetensors"),
        ("no-config", "no adapter_config.json"),
    ],
)
def test_bad_adapter_folders_are_refused_with_the_reason(
    qwen_refs: References, qwen_adapters: dict[str, Path], tmp_path: Path, case: str, message: str
) -> None:
    targets = AdapterBank(qwen_refs.models[None], 1).targets
    folder = _broken(tmp_path, qwen_adapters["all"], case)
    with pytest.raises(AdapterError, match=message):
        read_adapter("bad", folder, targets)


def test_a_bad_folder_stops_startup(
    tiny_qwen3: Path, qwen_adapters: dict[str, Path], tmp_path: Path
) -> None:
    folder = _broken(tmp_path, qwen_adapters["all"], "wrong-shape")
    with pytest.raises(UsageError, match=f"--lora bad={folder}: .*this model's layer needs"):
        make_runtime(
            tiny_qwen3,
            "lora",
            plugin_options={"lora": [f"bad={folder}", f"all={qwen_adapters['all']}"]},
        )


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["no-equals-sign"], "expected NAME=PATH"),
        (["a=/x", "a=/y"], "given twice"),
        (["a=/x", "b=/y", "c=/z"], "more than --max-loras 2"),
        (["tiny=/x"], "already the model's name"),
    ],
)
def test_bad_lora_flags_are_refused(specs: list[str], message: str) -> None:
    config = ServerConfig(
        served_model_name=("tiny",), plugin_options={"lora": specs, "max_loras": 2}
    )
    with pytest.raises(UsageError, match=message):
        mlxcore_configure(config)


def test_distributed_is_refused() -> None:
    config = ServerConfig(distributed=True, plugin_options={"lora": ["a=/x"]})
    with pytest.raises(UsageError, match="--distributed"):
        mlxcore_configure(config)
