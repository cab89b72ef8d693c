"""GGUF -> MLX conversion, checked numerically and on the real SmolLM2 GGUF.

The synthetic tests write a small random llama / qwen2 model into a GGUF file the way
llama.cpp's converter does (names, metadata, Q/K row permutation for llama, optional Q8_0
blocks) with the ``gguf`` package, convert it back and compare logits with the original.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcore.models import ModelLoadError, convert_gguf, resolve_model
from mlxcore.models.gguf import mlx_name, unpermute_rows

gguf = pytest.importorskip("gguf")
mlx_lm = pytest.importorskip("mlx_lm")

LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
TOKENS = [*LETTERS, "Ġ", "ab", "cd", "<s>", "</s>", "<unk>"]  # 32 byte-level tokens
BOS, EOS = TOKENS.index("<s>"), TOKENS.index("</s>")
TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
INPUT_IDS = [BOS, 0, 27, 26, 2, 28, 5, 7, 26, 11]


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py), written independently."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tiny_config(model_type: str) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": len(TOKENS),
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "tie_word_embeddings": model_type == "llama",
    }


def make_model(model_type: str, seed: int) -> tuple[Any, dict[str, np.ndarray]]:
    import importlib

    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(tiny_config(model_type)))
    params = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
    # random norms, so a wrong norm mapping cannot hide behind all-ones weights
    rng = np.random.default_rng(seed)
    for key in params:
        if key.endswith("norm.weight"):
            params[key] = (1 + 0.1 * rng.standard_normal(params[key].shape)).astype(np.float32)
    model.load_weights([(k, mx.array(v)) for k, v in params.items()])
    return model, params


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(key: str) -> str:
    base, _, part = key.rpartition(".")
    if base == "model.embed_tokens":
        return f"token_embd.{part}"
    if base == "model.norm":
        return f"output_norm.{part}"
    if base == "lm_head":
        return f"output.{part}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}.{part}"


def write_gguf(path: Path, arch: str, params: dict[str, np.ndarray], *, q8: bool = False) -> Path:
    cfg = tiny_config(arch)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3 if t.startswith("<") else 1 for t in TOKENS])
    writer.add_token_merges(["a b", "c d"])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_chat_template(TEMPLATE)
    for key, value in params.items():
        name = gguf_name(key)
        if arch == "llama" and ".attn_q." in name:
            value = llama_cpp_permute(value, cfg["num_attention_heads"])
        elif arch == "llama" and ".attn_k." in name:
            value = llama_cpp_permute(value, cfg["num_key_value_heads"])
        if q8 and value.ndim == 2:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def logits(model: Any) -> np.ndarray:
    out = model(mx.array([INPUT_IDS]))
    return np.array(out.astype(mx.float32))


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    rng = np.random.default_rng(0)
    for n_head, shape in ((4, (64, 12)), (2, (32, 8)), (3, (48,))):
        w = rng.standard_normal(shape).astype(np.float32)
        back = unpermute_rows(mx.array(llama_cpp_permute(w, n_head)), n_head)
        np.testing.assert_array_equal(np.array(back), w)
        assert not np.array_equal(llama_cpp_permute(w, n_head), w)


def test_tensor_name_mapping() -> None:
    assert mlx_name("token_embd") == "model.embed_tokens"
    assert mlx_name("output_norm") == "model.norm"
    assert mlx_name("output") == "lm_head"
    assert mlx_name("blk.7.attn_q") == "model.layers.7.self_attn.q_proj"
    assert mlx_name("blk.0.attn_output") == "model.layers.0.self_attn.o_proj"
    assert mlx_name("blk.3.ffn_down") == "model.layers.3.mlp.down_proj"
    assert mlx_name("blk.3.ffn_norm") == "model.layers.3.post_attention_layernorm"
    assert mlx_name("blk.3.ffn_gate_exps") is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_synthetic_gguf_round_trip_matches_original_logits(tmp_path: Path, arch: str) -> None:
    model, params = make_model(arch, seed=1)
    src = write_gguf(tmp_path / f"tiny-{arch}.gguf", arch, params)
    out = convert_gguf(src, tmp_path / "out", dtype="float32")

    loaded, tokenizer, config = mlx_lm.load(str(out), return_config=True)
    assert config["model_type"] == arch
    assert config["tie_word_embeddings"] is (arch == "llama")
    np.testing.assert_allclose(logits(loaded), logits(model), rtol=1e-4, atol=1e-4)

    assert tokenizer.encode("ab cd", add_special_tokens=False) == [27, 26, 28]
    assert tokenizer.decode([27, 26, 28]) == "ab cd"
    assert tokenizer.eos_token_id == EOS
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=False
    )
    assert rendered == "<s>hi</s>"


def test_q8_0_gguf_quantized_and_float_conversions_agree(tmp_path: Path) -> None:
    model, params = make_model("llama", seed=2)
    src = write_gguf(tmp_path / "tiny-q8.gguf", "llama", params, q8=True)
    dense = convert_gguf(src, tmp_path / "f32", dtype="float32")
    quant = convert_gguf(src, tmp_path / "q", dtype="quantized")

    dense_model, _ = mlx_lm.load(str(dense))
    quant_model, _, qconfig = mlx_lm.load(str(quant), return_config=True)
    assert qconfig["quantization"]["bits"] == 8
    assert qconfig["quantization"]["group_size"] == 32
    q_proj = quant_model.model.layers[0].self_attn.q_proj
    assert q_proj.scales.dtype == mx.float32  # fast CPU path: float32 scales
    # Same Q8_0 blocks, once dequantized, once kept packed: the same function.
    np.testing.assert_allclose(logits(quant_model), logits(dense_model), rtol=1e-3, atol=1e-3)
    # And Q8_0 is close to the float original.
    reference = logits(model)
    assert np.abs(logits(dense_model) - reference).max() < 0.05 * np.abs(reference).max()


def test_unsupported_architecture_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"other\.gguf.*'bert'"):
        convert_gguf(path, tmp_path / "out")


def test_corrupt_gguf_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(ModelLoadError, match=r"broken\.gguf"):
        resolve_model(str(path), cache_dir=tmp_path / "cache")
    _, params = make_model("llama", seed=3)
    good = write_gguf(tmp_path / "good.gguf", "llama", params)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size - 100])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf is corrupt or truncated"):
        convert_gguf(cut, tmp_path / "out")
    with pytest.raises(ModelLoadError, match=r"missing\.gguf"):
        resolve_model(str(tmp_path / "missing.gguf"), cache_dir=tmp_path / "cache")


@pytest.mark.slow
def test_real_smollm2_gguf_converts_once_and_answers_paris(tmp_path: Path) -> None:
    from mlx_lm.sample_utils import make_sampler

    from mlxcore.models.default import ensure_default_gguf
    from mlxcore.models.resolve import default_models_dir

    source = ensure_default_gguf(default_models_dir())
    cache = tmp_path / "cache"
    first = resolve_model(str(source), cache_dir=cache, gguf_dtype="quantized")
    assert first.converted and first.kind == "gguf"
    assert first.path.parent == cache
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns

    second = resolve_model(str(source), cache_dir=cache, gguf_dtype="quantized")
    assert not second.converted
    assert second.path == first.path
    assert (second.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in cache.iterdir()] == [first.path.name]  # no temp folders left

    model, tokenizer = mlx_lm.load(str(second.path))
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
    )
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=16, sampler=make_sampler(0.0))
    assert "Paris" in text
