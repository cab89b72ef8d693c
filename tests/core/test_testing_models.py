"""Tests of mlxcore.testing: the small real models and the pytest plugin that hands them out.

Everything runs for real: the folders are loaded by ``mlx_lm.load`` and run on MLX's CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mlxcore.testing import build_test_model, model_cache_key, read_manifest
from mlxcore.testing.model_specs import GEMMA4_SPECIAL_TOKENS, MODEL_SPECS
from mlxcore.testing.models import MANIFEST_NAME, default_test_models_root

mx = pytest.importorskip("mlx.core")
mlx_lm = pytest.importorskip("mlx_lm")

ARCH_FIXTURES = {
    "llama": "tiny_llama",
    "qwen3": "tiny_qwen3",
    "qwen3_5": "tiny_qwen3_5",
    "qwen3_5_moe": "tiny_qwen3_5_moe",
    "gemma4_text": "tiny_gemma4",
}
TURN_MARKERS = {
    "llama": "<|im_start|>",
    "qwen3": "<|im_start|>",
    "qwen3_5": "<|im_start|>",
    "qwen3_5_moe": "<|im_start|>",
    "gemma4_text": "<|turn>",
}
USER_MESSAGE = [{"role": "user", "content": "What is 2+2?"}]


class Loaded:
    """One tiny model loaded by mlx-lm."""

    def __init__(self, arch: str, path: Path) -> None:
        self.arch = arch
        self.path = path
        self.model, self.tokenizer = mlx_lm.load(str(path))
        self.config: dict[str, Any] = json.loads((path / "config.json").read_text())

    @property
    def text_config(self) -> dict[str, Any]:
        return self.config.get("text_config", self.config)


_LOADED: dict[str, Loaded] = {}


def _load(request: pytest.FixtureRequest, arch: str) -> Loaded:
    """Load each tiny model once per test session (loading is the slow part)."""
    if arch not in _LOADED:
        _LOADED[arch] = Loaded(arch, request.getfixturevalue(ARCH_FIXTURES[arch]))
    return _LOADED[arch]


@pytest.fixture(params=list(ARCH_FIXTURES))
def loaded(request: pytest.FixtureRequest) -> Loaded:
    return _load(request, request.param)


def _weights(path: Path) -> dict[str, Any]:
    return mx.load(str(path / "model.safetensors"))


# --------------------------------------------------------------------------- every arch


def test_fixture_archs_are_registered() -> None:
    assert set(ARCH_FIXTURES) <= set(MODEL_SPECS)


def test_loads_and_generates_greedily(loaded: Loaded) -> None:
    tokenizer = loaded.tokenizer
    prompt = tokenizer.apply_chat_template(USER_MESSAGE, add_generation_prompt=True)
    logits = loaded.model(mx.array([prompt]))
    vocab_size = loaded.text_config["vocab_size"]
    assert logits.shape == (1, len(prompt), vocab_size)
    assert logits.dtype == mx.float32
    assert mx.all(mx.isfinite(logits)).item()

    responses = list(mlx_lm.stream_generate(loaded.model, tokenizer, prompt, max_tokens=8))
    assert 1 <= len(responses) <= 8
    assert responses[-1].generation_tokens == len(responses)
    assert all(0 <= r.token < vocab_size for r in responses)

    text = mlx_lm.generate(loaded.model, tokenizer, prompt, max_tokens=8)
    assert isinstance(text, str)
    assert text == mlx_lm.generate(loaded.model, tokenizer, prompt, max_tokens=8)


def test_chat_template_has_family_markers(loaded: Loaded) -> None:
    marker = TURN_MARKERS[loaded.arch]
    spec = MODEL_SPECS[loaded.arch]
    rendered = loaded.tokenizer.apply_chat_template(
        USER_MESSAGE, add_generation_prompt=True, tokenize=False
    )
    assert marker in rendered
    assert "What is 2+2?" in rendered
    # The template is the family's official one, shipped beside the weights.
    template_file = (loaded.path / "chat_template.jinja").read_text()
    assert loaded.tokenizer.chat_template == template_file
    assert template_file == _asset_template(spec.chat_template)
    # The turn marker is one special token of the vocabulary, not spelled out in pieces.
    marker_id = loaded.tokenizer.convert_tokens_to_ids(marker)
    ids = loaded.tokenizer.apply_chat_template(USER_MESSAGE, add_generation_prompt=True)
    assert marker_id in ids
    assert loaded.tokenizer.encode(marker, add_special_tokens=False) == [marker_id]


def test_config_vocab_covers_tokenizer_and_weights_are_float32(loaded: Loaded) -> None:
    assert loaded.text_config["vocab_size"] >= len(loaded.tokenizer._tokenizer)
    weights = _weights(loaded.path)
    assert {w.dtype for w in weights.values()} == {mx.float32}
    embed = next(w for k, w in weights.items() if k.endswith("embed_tokens.weight"))
    assert embed.shape == (loaded.text_config["vocab_size"], loaded.text_config["hidden_size"])
    eos = loaded.config["eos_token_id"]
    assert set(eos if isinstance(eos, list) else [eos]) <= loaded.tokenizer.eos_token_ids


def _asset_template(name: str) -> str:
    from importlib import resources

    return (
        resources.files("mlxcore.testing")
        .joinpath("assets", "chat-templates", name)
        .read_text(encoding="utf-8")
    )


# --------------------------------------------------------------------------- gemma 4


def test_gemma4_template_markers_are_the_added_special_tokens() -> None:
    template = _asset_template(MODEL_SPECS["gemma4_text"].chat_template)
    markers = set(re.findall(r"<\|[^<>|\s]*\|?>|<[^<>|\s]*\|>", template))
    assert markers == set(GEMMA4_SPECIAL_TOKENS)


def test_gemma4_special_tokens_are_single_ids(request: pytest.FixtureRequest) -> None:
    gemma4 = _load(request, "gemma4_text")
    tokenizer = gemma4.tokenizer._tokenizer  # the transformers tokenizer mlx-lm wraps
    ids = {}
    for token in GEMMA4_SPECIAL_TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, (token, encoded)
        assert tokenizer.decode(encoded) == token
        ids[token] = encoded[0]
    assert len(set(ids.values())) == len(GEMMA4_SPECIAL_TOKENS)
    assert min(ids.values()) >= 262145  # appended after the Gemma 3 vocabulary
    # Added as special tokens: flagged special, dropped by skip_special_tokens.
    assert all(tokenizer.added_tokens_decoder[i].special for i in ids.values())
    sample = tokenizer.encode('a<|turn>b<|"|>c', add_special_tokens=False)
    assert tokenizer.decode(sample, skip_special_tokens=True) == "abc"
    rendered = tokenizer.apply_chat_template(
        USER_MESSAGE, add_generation_prompt=True, tokenize=False
    )
    assert rendered.startswith("<bos><|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n")
    assert ids["<turn|>"] in gemma4.config["eos_token_id"]
    assert gemma4.config["vocab_size"] == len(tokenizer)


# --------------------------------------------------------------------------- qwen3.5


def test_qwen3_5_checkpoint_has_mtp_head(tiny_qwen3_5: Path) -> None:
    config = json.loads((tiny_qwen3_5 / "config.json").read_text())
    text = config["text_config"]
    hidden = text["hidden_size"]
    assert text["mtp_num_hidden_layers"] == 1
    weights = _weights(tiny_qwen3_5)
    mtp = {k: v for k, v in weights.items() if k.startswith("mtp.")}
    assert mtp["mtp.fc.weight"].shape == (hidden, 2 * hidden)
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        assert mtp[f"mtp.{name}.weight"].shape == (hidden,)
    heads, head_dim = text["num_attention_heads"], text["head_dim"]
    assert mtp["mtp.layers.0.self_attn.q_proj.weight"].shape == (2 * heads * head_dim, hidden)
    for name in ("k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
        assert f"mtp.layers.0.self_attn.{name}.weight" in mtp
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert f"mtp.layers.0.mlp.{name}.weight" in mtp
    assert not any(".linear_attn." in k for k in mtp)
    # The rest is laid out like the official checkpoints.
    assert all(k.startswith(("model.language_model.", "mtp.")) for k in weights)


def test_qwen3_5_is_hybrid_and_loads_through_sanitize(request: pytest.FixtureRequest) -> None:
    qwen3_5 = _load(request, "qwen3_5")
    model = qwen3_5.model
    kinds = [layer.is_linear for layer in model.layers]
    assert True in kinds and False in kinds
    assert [k == "linear_attention" for k in qwen3_5.text_config["layer_types"]] == kinds
    # Zero-centred norms (stored as w - 1) come back as w after mlx-lm's sanitize.
    layer = model.layers[kinds.index(False)]
    assert mx.array_equal(layer.input_layernorm.weight, mx.ones_like(layer.input_layernorm.weight))
    assert layer.self_attn.q_norm.weight.min().item() == 1.0
    conv = model.layers[0].linear_attn.conv1d.weight
    assert conv.shape[-1] == 1  # mlx layout after sanitize
    assert not any("mtp" in name for name, _ in _named_params(model))


def _named_params(model: Any) -> list[tuple[str, Any]]:
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())


# --------------------------------------------------------------------------- builds, cache


def test_same_args_same_weights_other_seed_differs(tiny_llama: Path, tmp_path: Path) -> None:
    again = build_test_model("llama", root=tmp_path)
    assert again != tiny_llama and again.name == tiny_llama.name
    reference, rebuilt = _weights(tiny_llama), _weights(again)
    assert reference.keys() == rebuilt.keys()
    for name, value in reference.items():
        assert mx.array_equal(value, rebuilt[name]), name

    other = _weights(build_test_model("llama", root=tmp_path, seed=1))
    assert other.keys() == reference.keys()
    differing = [k for k in reference if not mx.array_equal(reference[k], other[k])]
    assert "model.embed_tokens.weight" in differing
    assert any(".self_attn.q_proj." in k for k in differing)


def test_second_call_reuses_the_cache(tmp_path: Path) -> None:
    first = build_test_model("llama", root=tmp_path, seed=3)
    weights_file = first / "model.safetensors"
    before = (weights_file.stat().st_mtime_ns, weights_file.stat().st_ino)
    manifest = read_manifest(first)

    started = time.perf_counter()
    second = build_test_model("llama", root=tmp_path, seed=3)
    elapsed = time.perf_counter() - started
    assert second == first
    assert elapsed < 0.5
    assert (weights_file.stat().st_mtime_ns, weights_file.stat().st_ino) == before
    assert read_manifest(second) == manifest
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        first.name
    ]


def test_factory_fixture_uses_the_persistent_cache(
    mlxcore_model_factory: Any, tiny_llama: Path
) -> None:
    started = time.perf_counter()
    assert mlxcore_model_factory("llama") == tiny_llama
    assert time.perf_counter() - started < 0.5
    assert tiny_llama.parent == default_test_models_root()
    assert (tiny_llama / MANIFEST_NAME).is_file()


def test_concurrent_builders_share_one_folder(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; from mlxcore.testing import build_test_model;"
        "print(build_test_model('llama', root=Path(sys.argv[1]), seed=7, num_hidden_layers=1))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    built = Path(paths.pop())
    assert read_manifest(built)["seed"] == 7
    assert read_manifest(built)["overrides"] == {"num_hidden_layers": 1}
    assert json.loads((built / "config.json").read_text())["num_hidden_layers"] == 1
    assert not any(k.startswith("model.layers.1.") for k in _weights(built))
    leftovers = [p.name for p in tmp_path.iterdir() if p != built and not p.name.endswith(".lock")]
    assert leftovers == []


def test_cache_key_depends_on_every_argument() -> None:
    base = model_cache_key("qwen3")
    assert base == model_cache_key("qwen3", size="tiny", seed=0)
    assert base.startswith("qwen3-tiny-seed0-")
    others = {
        model_cache_key("qwen3", seed=1),
        model_cache_key("qwen3", size="small"),
        model_cache_key("qwen3", num_hidden_layers=3),
        model_cache_key("qwen3", num_hidden_layers=4),
        model_cache_key("llama"),
    }
    assert base not in others and len(others) == 5
    with pytest.raises(ValueError, match="unknown test-model arch"):
        model_cache_key("no_such_arch")
    with pytest.raises(ValueError, match="no size"):
        model_cache_key("qwen3", size="huge")
    with pytest.raises(ValueError, match="JSON"):
        model_cache_key("qwen3", hidden_size=object())


def test_default_root_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLXCORE_TEST_MODELS", str(tmp_path / "explicit"))
    monkeypatch.setenv("MLXCORE_HOME", str(tmp_path / "home"))
    assert default_test_models_root() == tmp_path / "explicit"
    monkeypatch.delenv("MLXCORE_TEST_MODELS")
    assert default_test_models_root() == tmp_path / "home" / "test-models"
    monkeypatch.delenv("MLXCORE_HOME")
    assert default_test_models_root() == Path.home() / ".cache" / "mlxcore" / "test-models"


def test_too_small_vocab_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        build_test_model("llama", root=tmp_path, vocab_size=1000)
    assert [p for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


# --------------------------------------------------------------------------- the plugin


def test_plugin_is_registered_and_cheap_to_import(request: pytest.FixtureRequest) -> None:
    plugin = request.config.pluginmanager.get_plugin("mlxcore")
    assert plugin is not None
    assert plugin.__name__ == "mlxcore.testing.pytest_plugin"
    code = (
        "import sys, mlxcore.testing.pytest_plugin;"
        "heavy = [m for m in ('mlx', 'mlx.core', 'mlx_lm', 'transformers', 'tokenizers')"
        " if m in sys.modules];"
        "print(heavy)"
    )
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"
