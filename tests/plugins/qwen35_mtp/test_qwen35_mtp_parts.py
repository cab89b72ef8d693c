"""The `qwen35-mtp` plugin's parts: rejection sampling keeps the target distribution,
rollback leaves the hybrid cache exactly as plain decoding would, `mlxcore mtp extract`
restores a stripped head, options are validated."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import ArraysCache, KVCache

from mlxcore.cli.main import main
from mlxcore.config import ServerConfig
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.sampling import greedy
from mlxcore.engine.strategies import DecodeSequence
from mlxcore.errors import UsageError
from mlxcore.models import load_model
from mlxcore.speculative.accept import REJECTION, KeyStream, decide, draft_token
from mlxcore_qwen35_mtp import mlxcore_patch_model
from mlxcore_qwen35_mtp.decoder import MTPDecoder
from mlxcore_qwen35_mtp.head import LAYOUT_KEY, SIDECAR, build_head


def test_rejection_sampling_preserves_target_distribution() -> None:
    target = mx.array([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    target = target - mx.logsumexp(target, axis=-1, keepdims=True)
    head_logits = mx.array([[-1.0, 0.5, 2.0, 0.0]])  # a head that disagrees a lot
    params = SamplingParams(temperature=1.0)
    keys = KeyStream(1234)
    trials = 3000
    counts = [0, 0, 0, 0]
    accepted = 0
    for _ in range(trials):
        token, q = draft_token(REJECTION, params, head_logits, keys)
        drafts = [int(token.item())]
        emitted = decide(REJECTION, params, None, target, drafts, [q], keys)
        counts[emitted[0]] += 1
        accepted += len(emitted) - 1
    expected = mx.softmax(target[0]).tolist()
    chi2 = sum((c - trials * p) ** 2 / (trials * p) for c, p in zip(counts, expected, strict=True))
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001
    # acceptance equals sum(min(p, q)), not just the chance of sampling the same token
    q_probs = mx.softmax(head_logits[0]).tolist()
    overlap = sum(min(a, b) for a, b in zip(expected, q_probs, strict=True))
    assert abs(accepted / trials - overlap) < 0.04


def _state(cache: list) -> list:
    out = []
    for c in cache:
        if isinstance(c, ArraysCache):
            out.append(("arrays", [mx.array(a) for a in c.cache]))
        else:
            out.append(("kv", c.offset, c.keys[..., : c.offset, :], c.values[..., : c.offset, :]))
    return out


class _Steered:
    """The real head whose first ``len(forced)`` drafts are forced."""

    def __init__(self, real, forced: list[int]) -> None:
        self.real = real
        self.forced = forced
        self.make_cache = real.make_cache
        self.forward_main = real.forward_main
        self.verify = real.verify

    def draft(self, tokens, hidden, cache, last=None):
        h, logits = self.real.draft(tokens, hidden, cache, last)
        if not self.forced:
            return h, logits
        return h, mx.zeros(logits.shape).at[..., self.forced.pop(0)].add(10.0)


@pytest.mark.parametrize("k,drafts_right,batch", [(1, 0, 1), (3, 1, 1), (3, 3, 1), (2, 1, 3)])
def test_rollback_matches_plain_feeding(
    tiny_qwen3_5: Path, k: int, drafts_right: int, batch: int
) -> None:
    """After a round whose drafts are partly rejected, the sequence's cache (taken out of the
    batch) equals the cache of plain one-by-one feeding of the emitted tokens."""
    loaded = load_model(tiny_qwen3_5)
    model = loaded.model
    head = build_head(model, loaded.info)
    prompt = mx.array([[9707, 11, 1879, 0, 576]])
    plain_cache = model.make_cache()
    logits = model(prompt, cache=plain_cache)
    x = int(mx.argmax(logits[0, -1]).item())
    truth = [x]
    for _ in range(k + 2):  # the greedy continuation, one token at a time
        truth.append(
            int(mx.argmax(model(mx.array([[truth[-1]]]), cache=plain_cache)[0, -1]).item())
        )
    forced = [truth[2 + i] + (0 if i < drafts_right else 1) for i in range(k)]
    decoder = MTPDecoder(model, _Steered(head, []), num_speculative_tokens=k, auto_off=False)
    seqs = []
    for uid in range(batch):  # other rows (shorter prompts) share the batch
        cache = model.make_cache()
        model(prompt[:, : prompt.shape[1] - uid], cache=cache)
        tokens = [1] * (prompt.shape[1] - uid) + [x]
        seqs.append(DecodeSequence(uid, GenerationRequest([1], 8), cache, tokens, x, greedy))
    decoder.head = _Steered(head, list(forced))  # row 0 primes first: its drafts are forced
    for seq in seqs:
        decoder.add(seq)
    decoder.step()  # prime: one plain token each, drafts for round 2
    assert seqs[0].tokens[-1] == truth[1]
    decoder.step()  # the round: verify, accept, roll back
    seq = seqs[0]
    emitted = seq.tokens[prompt.shape[1] + 2 :]
    assert emitted == truth[2 : 2 + drafts_right + 1]
    own = decoder.remove(0)
    assert own is not None and own.length == len(seq.tokens) - 1

    reference = model.make_cache()
    model(prompt, cache=reference)
    model(mx.array([seq.tokens[prompt.shape[1] : -1]]), cache=reference)
    for mine, theirs in zip(_state(own.cache), _state(reference), strict=True):
        assert mine[0] == theirs[0]
        if mine[0] == "arrays":
            for a, b in zip(mine[1], theirs[1], strict=True):
                assert mx.allclose(a, b, atol=1e-5).item()
        else:
            assert mine[1] == theirs[1]
            assert mx.allclose(mine[2], theirs[2], atol=1e-5).item()


def _strip(source: Path, target: Path) -> None:
    shutil.copytree(source, target)
    weights, metadata = mx.load(str(source / "model.safetensors"), return_metadata=True)
    kept = {k: v for k, v in weights.items() if not k.startswith("mtp.")}
    mx.save_safetensors(str(target / "model.safetensors"), kept, metadata=metadata)


def test_extract_restores_a_stripped_head(tiny_qwen3_5: Path, tmp_path: Path, capsys) -> None:
    stripped = tmp_path / "stripped"
    _strip(tiny_qwen3_5, stripped)
    cfg = ServerConfig(model=str(stripped))
    loaded = load_model(stripped)
    mlxcore_patch_model(loaded.model, loaded.info, cfg)
    assert not hasattr(loaded.model, "mlxcore_mtp")  # no head: the plugin stays off

    assert main(["mtp", "extract", str(tiny_qwen3_5), str(stripped)]) == 0
    assert "MTP tensors" in capsys.readouterr().out
    sidecar, metadata = mx.load(str(stripped / SIDECAR), return_metadata=True)
    assert metadata[LAYOUT_KEY] == "hf"
    original = {k: v for k, v in mx.load(str(tiny_qwen3_5 / "model.safetensors")).items()}
    assert sidecar.keys() == {k for k in original if k.startswith("mtp.")}

    loaded = load_model(stripped)
    mlxcore_patch_model(loaded.model, loaded.info, cfg)
    from_sidecar = loaded.model.mlxcore_mtp.module
    full = load_model(tiny_qwen3_5)
    from_checkpoint = build_head(full.model, full.info).module
    assert mx.array_equal(from_sidecar.fc.weight, from_checkpoint.fc.weight).item()
    assert mx.array_equal(from_sidecar.norm.weight, from_checkpoint.norm.weight).item()
    # mlx-lm itself still loads the folder (it drops the sidecar's mtp.* tensors)
    load(str(stripped))


def test_extract_errors(tmp_path: Path) -> None:
    assert main(["mtp", "extract", str(tmp_path), str(tmp_path / "missing")]) == 1
    (tmp_path / "model").mkdir()
    assert main(["mtp", "extract", str(tmp_path / "model"), str(tmp_path)]) == 1


def test_validate_and_configure() -> None:
    """The shared speculative option and flags (built-in, so every speculative plugin
    can rely on them) are checked."""
    from mlxcore.builtin.speculative import mlxcore_configure, mlxcore_validate_options

    cfg = ServerConfig(model="x")
    mlxcore_validate_options({"speculative": False}, cfg)
    mlxcore_validate_options({"other": 1}, cfg)
    with pytest.raises(ValueError) as err:
        mlxcore_validate_options({"speculative": "no"}, cfg)
    assert err.value.args[0] == "speculative"
    mlxcore_configure(cfg)
    with pytest.raises(UsageError):
        mlxcore_configure(ServerConfig(model="x", plugin_options={"num_speculative_tokens": 0}))


def test_kv_only_cache_is_supported() -> None:
    from mlxcore_qwen35_mtp.decoder import cache_supported

    assert cache_supported([KVCache(), ArraysCache(2)])
