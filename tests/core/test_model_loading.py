"""Resolving and loading model folders, and every way that can fail.

The model is a tiny random llama written here (real safetensors, real tokenizer built with
``tokenizers``), loaded with mlx-lm's real loader. Errors must name the path or repo.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlxcore.model_info import ModelInfo
from mlxcore.models import (
    LoadedModel,
    ModelLoadError,
    ResolvedModel,
    load_model,
    read_weight_keys,
    resolve_model,
)
from mlxcore.models.folder import check_fits_in_memory, mlx_module_for, read_safetensors_header

WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "paris", "france", "capital"]
TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-5,
    "vocab_size": len(WORDS),
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=TEMPLATE,
    )
    tokenizer.save_pretrained(str(folder))


def write_model(folder: Path, config: dict[str, Any] | None = None) -> Path:
    """A tiny real llama folder; ``mtp.safetensors`` holds a tensor mlx-lm never loads."""
    from mlx_lm.models import llama

    config = config or CONFIG
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    mx.save_safetensors(str(folder / "mtp.safetensors"), {"mtp.fc.weight": mx.zeros((4, 4))})
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "tiny-llama")


def test_resolve_local_folder(tiny_folder: Path) -> None:
    resolved = resolve_model(str(tiny_folder))
    assert resolved == ResolvedModel(path=tiny_folder.resolve(), source=str(tiny_folder))
    assert resolved.kind == "folder" and not resolved.converted


def test_load_model_builds_model_info(tiny_folder: Path) -> None:
    loaded = load_model(str(tiny_folder))
    assert isinstance(loaded, LoadedModel)
    info = loaded.info
    assert isinstance(info, ModelInfo)
    assert info.path == tiny_folder.resolve()
    assert info.source == str(tiny_folder)
    assert info.model_type == "llama"
    assert info.config["hidden_size"] == 32
    assert info.chat_template == TEMPLATE
    assert info.template_mentions("<s>", "</s>")
    assert info.vocab["paris"] == WORDS.index("paris") and info.has_token("france")
    assert info.eos_token_ids == frozenset({2})
    # every tensor of every safetensors file, including the one mlx-lm does not load
    assert "model.embed_tokens.weight" in info.weight_keys
    assert "model.layers.0.self_attn.q_proj.weight" in info.weight_keys
    assert "mtp.fc.weight" in info.weight_keys
    assert not hasattr(loaded.model, "mtp")
    out = loaded.model(mx.array([[1, 3, 4]]))
    assert out.shape == (1, 3, len(WORDS))
    assert loaded.tokenizer.encode("hello world", add_special_tokens=False) == [3, 4]


def test_read_weight_keys_reads_headers_only(tiny_folder: Path) -> None:
    keys = read_weight_keys(tiny_folder)
    flat = dict(tree_flatten(mx.load(str(tiny_folder / "model.safetensors"))))
    assert set(flat) | {"mtp.fc.weight"} == keys


def test_missing_folder_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match=re.escape(str(missing))):
        resolve_model(str(missing))


def test_folder_without_config_names_the_path(tmp_path: Path) -> None:
    folder = tmp_path / "no-config"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(folder))}.*config\.json"):
        resolve_model(str(folder))


def test_unknown_architecture_names_the_path(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "alien", {**CONFIG, "model_type": "no_such_arch"})
    with pytest.raises(ModelLoadError, match=rf"no_such_arch.*{re.escape(str(folder))}"):
        resolve_model(str(folder))


def test_mlx_lm_model_type_remapping_is_honoured(tmp_path: Path) -> None:
    assert mlx_module_for({"model_type": "mistral"}, tmp_path) == "llama"
    assert mlx_module_for({"model_type": "qwen3"}, tmp_path) == "qwen3"


def test_truncated_safetensors_names_the_file(tmp_path: Path, tiny_folder: Path) -> None:
    folder = write_model(tmp_path / "truncated")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(weights))} is truncated"):
        resolve_model(str(folder))
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(ResolvedModel(path=folder, source=str(folder)))


def test_corrupt_safetensors_header_names_the_file(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "garbage")
    weights = folder / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 20) + b"{not json at all!!!}" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(weights))} is corrupt"):
        resolve_model(str(folder))


def test_folder_without_weights_names_the_path(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "empty")
    (folder / "model.safetensors").unlink()
    with pytest.raises(
        ModelLoadError, match=rf"no model\*\.safetensors .*{re.escape(str(folder))}"
    ):
        resolve_model(str(folder))


def test_weights_larger_than_memory_are_refused(tmp_path: Path) -> None:
    """A sparse 4 TiB safetensors file: valid header, nothing on disk, cannot fit."""
    folder = write_model(tmp_path / "huge")
    weights = folder / "model.safetensors"
    size = 4 * 1024**4
    header = json.dumps({"w": {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}})
    blob = struct.pack("<Q", len(header)) + header.encode()
    weights.write_bytes(blob)
    try:
        os.truncate(weights, len(blob) + size)
    except OSError:
        pytest.skip("filesystem cannot hold a sparse 4 TiB file")
    assert read_safetensors_header(weights)["w"]["shape"] == [size]
    with pytest.raises(
        ModelLoadError, match=rf"not enough memory for {re.escape(str(folder))}.*GiB"
    ):
        resolve_model(str(folder))
    resolve_model(str(folder), check_memory=False)  # the check, and only it, refused


def test_check_fits_in_memory(tmp_path: Path) -> None:
    check_fits_in_memory(1024, tmp_path)
    with pytest.raises(ModelLoadError, match=re.escape(str(tmp_path))):
        check_fits_in_memory(1 << 50, tmp_path)


def test_loader_failure_is_wrapped_with_the_path(tmp_path: Path) -> None:
    # weights for hidden_size 32, config claims 48: mlx-lm refuses the shapes
    folder = write_model(tmp_path / "mismatch", {**CONFIG, "hidden_size": 48})
    with pytest.raises(ModelLoadError, match=rf"cannot load model {re.escape(str(folder))}"):
        load_model(str(folder))


def test_hf_repo_offline_names_the_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.chdir(tmp_path)  # so "owner/name" is not a local folder
    repo = "mlxcore-tests/definitely-not-cached"
    with pytest.raises(ModelLoadError, match=rf"{repo}.*HF_HUB_OFFLINE=1") as excinfo:
        resolve_model(repo)
    assert "local Hugging Face cache" in str(excinfo.value)


def test_relative_path_that_looks_like_a_repo_is_a_folder(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "owner").mkdir()
    os.symlink(tiny_folder, tmp_path / "owner" / "model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved = resolve_model("owner/model")
    assert resolved.kind == "folder" and resolved.path == tiny_folder.resolve()
