"""lm-evaluation-harness against a real server, through its ``local-completions`` model:
a loglikelihood task (multiple choice: ``/v1/completions`` with ``echo`` + ``logprobs``,
the prompt's logprobs computed in the prefill) and a generate_until task, both defined
in ``lm_eval_tasks/`` on a local JSONL file (no hub). lm-eval tokenizes through the
server's ``/tokenizer_info``, ``/tokenize`` and ``/detokenize``.

Every loglikelihood lm-eval records equals one computed in-process with mlx-lm on the
same model within 1e-4, and every generation equals ``mlx_lm.generate``'s greedy text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

TASKS = Path(__file__).parent / "lm_eval_tasks"


@pytest.fixture(scope="module")
def results(scripted_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Any:
    # Offline only while lm-eval runs: a variable left in os.environ would reach every later
    # test's subprocesses on this worker (the model manager's tests talk to a local Hub).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        return _evaluate(scripted_server, tmp_path_factory)


def _evaluate(scripted_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    data = str(TASKS / "tiny_choice.jsonl")
    for name in ("tiny_choice.yaml", "tiny_generate.yaml"):
        text = (TASKS / name).read_text().replace("tiny_choice.jsonl", data)
        (folder / name).write_text(text)
    return simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": scripted_server.v1 + "/completions",
            "model": "tiny",
            "tokenizer_backend": "remote",
            "num_concurrent": 2,
            "max_retries": 1,
        },
        tasks=["mlxcore_tiny_choice", "mlxcore_tiny_generate"],
        task_manager=TaskManager(include_path=str(folder)),
        log_samples=True,
        random_seed=0,
    )


def continuation_logprob(model: Any, tokenizer: Any, context: str, continuation: str) -> float:
    """lm-eval's split of (context, continuation) into tokens, scored by one forward pass."""
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    head = tokenizer.encode(context, add_special_tokens=False)
    tail = whole[len(head) :]
    logits = model(mx.array(whole)[None])[0].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return sum(logprobs[len(head) - 1 + i, t].item() for i, t in enumerate(tail))


def test_loglikelihoods_equal_mlx_lm_s(results: Any, tiny_qwen3: Path) -> None:
    from mlx_lm import load

    model, tokenizer = load(str(tiny_qwen3))
    samples = results["samples"]["mlxcore_tiny_choice"]
    assert len(samples) == 6
    checked = 0
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"], strict=True):
            got = float(resp[0][0])
            want = continuation_logprob(model, tokenizer, context, continuation)
            assert abs(got - want) < 1e-4, (context, continuation, got, want)
            checked += 1
    assert checked == 18
    assert 0.0 <= results["results"]["mlxcore_tiny_choice"]["acc,none"] <= 1.0


def test_generations_equal_mlx_lm_s_greedy_text(results: Any, tiny_qwen3: Path) -> None:
    """The text is the exact continuation (leading space kept), cut at the stop string."""
    from mlx_lm import load, stream_generate

    model, tokenizer = load(str(tiny_qwen3))
    samples = results["samples"]["mlxcore_tiny_generate"]
    assert len(samples) == 6
    for sample in samples:
        context = sample["arguments"][0][0]
        ids = tokenizer.encode(context, add_special_tokens=False)
        out = [r.token for r in stream_generate(model, tokenizer, ids, max_tokens=8)]
        text = tokenizer.decode(ids + out)[len(tokenizer.decode(ids)) :]
        assert sample["resps"][0][0] == text.split("\n")[0], (context, text)
