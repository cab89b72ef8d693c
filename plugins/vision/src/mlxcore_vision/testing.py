"""Small real vision-language test models, built on the fly (for tests of this plugin).

:func:`build_test_vlm` writes a folder that ``mlx_vlm.load`` loads unchanged: ``config.json``
of a real mlx-vlm architecture (tiny sizes), ``model.safetensors`` with seeded random
float32 weights of mlx-vlm's own model class, the family's real tokenizer (from
``mlxcore.testing``'s assets), a real chat template that renders image and video parts,
and the processor configuration (``preprocessor_config.json``) with the family's real
fields. Nothing is mocked: tests load the folder with the real loaders.

Builds are cached by a hash of their arguments under ``default_test_models_root()``, with
``mlxcore.testing``'s locked, atomic builder: concurrent builders never see half a model.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

BUILDER_VERSION = 3
_MANIFEST = ".mlxcore-test-vlm.json"

# Token ids of the Qwen2/Qwen3 vocabulary (checked against the tokenizer at build time).
_QWEN_SPECIAL = {
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
}


def _qwen2_vl_config(token_ids: dict[str, int], eos: int, vocab_size: int) -> dict[str, Any]:
    return {
        "model_type": "qwen2_vl",
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "tie_word_embeddings": True,
        "eos_token_id": eos,
        **token_ids,
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
    }


def _qwen2_vl_preprocessor() -> dict[str, Any]:
    # The fields of Qwen2-VL's published preprocessor_config.json, with a small max_pixels
    # so test images stay a few dozen vision tokens.
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": 3136,
        "max_pixels": 112 * 112,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    }


def default_test_models_root() -> Path:
    """The same cache root as ``mlxcore.testing`` (``$MLXCORE_TEST_MODELS`` or
    ``$MLXCORE_HOME/test-models``)."""
    from mlxcore.testing import default_test_models_root as core_root

    return Path(core_root())


def available_vlm_architectures() -> list[str]:
    """Architectures :func:`build_test_vlm` can build."""
    return sorted(_BUILDERS)


def build_test_vlm(
    arch: str = "qwen2_vl", *, seed: int = 0, root: Path | None = None, size: str = "tiny"
) -> Path:
    """Build (or reuse) a tiny vision-language model folder and return it.

    Args:
        arch: one of :func:`available_vlm_architectures`.
        seed: ``mx.random.seed`` before the model is instantiated.
        root: cache folder (default: :func:`default_test_models_root`).
        size: ``"tiny"``; ``qwen3_5`` also has ``"small"`` (its text model at
            ``mlxcore.testing``'s small size with 16 layers: as in real checkpoints the
            weights outweigh per-step buffers, and the one-layer MTP head is a few
            percent of them).
    """
    if arch not in available_vlm_architectures():
        raise ValueError(f"unknown test VLM {arch!r}; known: {available_vlm_architectures()}")
    if size != "tiny" and arch != "qwen3_5":
        raise ValueError(f"test VLM {arch!r} comes in size 'tiny' only")
    fields = {"v": BUILDER_VERSION, "arch": arch, "seed": seed}
    if size != "tiny":
        fields["size"] = size
    key = json.dumps(fields, sort_keys=True)
    name = f"vlm-{arch}-{size}-seed{seed}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    from mlxcore.testing.models import build_folder_once

    base = Path(root) if root is not None else default_test_models_root()

    def build(folder: Path) -> None:
        if arch == "qwen3_5":
            _build_qwen3_5(folder, seed, size)
        else:
            _BUILDERS[arch](folder, seed)
        (folder / _MANIFEST).write_text(key)

    return build_folder_once(base, name, build, manifest=_MANIFEST)


def _spread(name: str, value: Any) -> Any:
    """Scale the seeded matrices up so that the tiny model's greedy output depends on its
    input (at the default initialisation every prompt decodes to one repeated token)."""
    if value.ndim >= 2 and "norm" not in name:
        return value * _SPREAD
    return value


_SPREAD = 4.0


def _asset(folder: str, name: str) -> str:
    base = resources.files("mlxcore.testing").joinpath("assets", folder)
    plain = base.joinpath(name)
    if plain.is_file():
        return plain.read_text(encoding="utf-8")
    return lzma.decompress(base.joinpath(name + ".xz").read_bytes()).decode("utf-8")


def _qwen2_5_vl_config(token_ids: dict[str, int], eos: int, vocab_size: int) -> dict[str, Any]:
    config = _qwen2_vl_config(token_ids, eos, vocab_size)
    config["model_type"] = "qwen2_5_vl"
    config["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
    config["vision_config"] = {
        "model_type": "qwen2_5_vl",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "tokens_per_second": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
        "in_channels": 3,
    }
    return config


def _write_qwen_tokenizer(folder: Path) -> tuple[dict[str, int], dict[str, int], int]:
    """Write the real Qwen tokenizer with Qwen3.5's official chat template (ChatML that
    renders image and video parts as ``<|vision_start|><|image_pad|><|vision_end|>``, the
    placeholders of Qwen-VL processors). Returns the special tokens' ids, the config's
    vision token fields, and the vocabulary size: one embedding row per token the
    tokenizer knows (the published checkpoints pad to 151936; ids past the tokenizer
    would be undecodable in a random model's output)."""
    tokenizer = json.loads(_asset("qwen3-tokenizer", "tokenizer.json"))
    tok_config = json.loads(_asset("qwen3-tokenizer", "tokenizer_config.json"))
    vocab = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    template = _asset("chat-templates", "Qwen3.5-4B.jinja")
    tok_config["chat_template"] = template
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False))
    (folder / "chat_template.jinja").write_text(template)
    token_ids = {field: vocab[token] for field, token in _QWEN_SPECIAL.items()}
    vocab_size = max(max(tokenizer["model"]["vocab"].values()), *vocab.values()) + 1
    return vocab, token_ids, vocab_size


def _build_qwen2_vl(folder: Path, seed: int) -> None:
    _build_qwen_vl(folder, seed, "qwen2_vl")


def _build_qwen2_5_vl(folder: Path, seed: int) -> None:
    _build_qwen_vl(folder, seed, "qwen2_5_vl")


def _build_qwen_vl(folder: Path, seed: int, arch: str) -> None:
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_vlm.models.{arch}")

    vocab, token_ids, vocab_size = _write_qwen_tokenizer(folder)
    eos = vocab["<|im_end|>"]
    preprocessor = _qwen2_vl_preprocessor()
    if arch == "qwen2_5_vl":
        preprocessor["processor_class"] = "Qwen2_5_VLProcessor"
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))

    make_config = _qwen2_5_vl_config if arch == "qwen2_5_vl" else _qwen2_vl_config
    config = make_config(token_ids, eos, vocab_size)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    mx.random.seed(seed)
    model_config = module.ModelConfig.from_dict(json.loads(json.dumps(config)))
    model_config.vision_config = module.VisionConfig.from_dict(config["vision_config"])
    model_config.text_config = module.TextConfig.from_dict(config)
    model = module.Model(model_config)
    flat = dict(tree_flatten(model.parameters()))
    weights = {name: _spread(name, value) for name, value in flat.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})


def _gemma3_config(vocab_size: int, eos: list[int]) -> dict[str, Any]:
    return {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "image_token_index": 262144,
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "mm_tokens_per_image": 4,
        "eos_token_id": eos,
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "rms_norm_eps": 1e-6,
            "vocab_size": vocab_size,
            "sliding_window": 512,
            "sliding_window_pattern": 2,
            "rope_local_base_freq": 10000.0,
            "rope_global_base_freq": 1000000.0,
            "mm_tokens_per_image": 4,
            "max_position_embeddings": 4096,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "patch_size": 14,
            "image_size": 56,
            "layer_norm_eps": 1e-6,
        },
    }


def _gemma3_preprocessor() -> dict[str, Any]:
    # The fields of Gemma 3's published preprocessor_config.json at a 56-pixel input size
    # (4x4 patches pooled to 2x2 = 4 image tokens).
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": 4,
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }


def _build_gemma3(folder: Path, seed: int) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import gemma3

    tokenizer = json.loads(_asset("gemma3-tokenizer", "tokenizer.json"))
    tok_config = json.loads(_asset("gemma3-tokenizer", "tokenizer_config.json"))
    vocab = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert vocab["<image_soft_token>"] == 262144
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False))
    (folder / "preprocessor_config.json").write_text(json.dumps(_gemma3_preprocessor()))
    (folder / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 4, "processor_class": "Gemma3Processor"})
    )
    vocab_size = max(vocab.values()) + 1
    config = _gemma3_config(vocab_size, [vocab["<eos>"], vocab["<end_of_turn>"]])
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    mx.random.seed(seed)
    model_config = gemma3.ModelConfig.from_dict(json.loads(json.dumps(config)))
    model_config.text_config = gemma3.TextConfig.from_dict(config["text_config"])
    model_config.vision_config = gemma3.VisionConfig.from_dict(config["vision_config"])
    model = gemma3.Model(model_config)
    flat = dict(tree_flatten(model.parameters()))
    weights = {name: _spread(name, value) for name, value in flat.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})


def _qwen3_vision_config(
    text_hidden: int, model_type: str, deepstack: tuple[int, ...] = ()
) -> dict[str, Any]:
    # The Qwen3-VL vision tower (Qwen3.5's is the same without deepstack) at a tiny size:
    # 16-pixel patches, 2x2 merge, learned position embeddings on an 8x8 grid.
    return {
        "model_type": model_type,
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "out_hidden_size": text_hidden,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "in_channels": 3,
        "deepstack_visual_indexes": list(deepstack),
    }


def _qwen3_vision_preprocessor() -> dict[str, Any]:
    # The fields of Qwen3-VL's and Qwen3.5's published preprocessor_config.json, with a small
    # longest_edge so test images stay a few dozen vision tokens.
    return {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128},
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


def _build_qwen3_5(folder: Path, seed: int, size: str = "tiny", arch: str = "qwen3_5") -> None:
    """A Qwen3.5 (or Qwen3.5 MoE) vision-language checkpoint in the official layout: the
    text model of ``mlxcore.testing`` (``model.language_model.*``, zero-centred norms,
    an ``mtp.*`` head; fused experts for MoE) plus a seeded vision tower."""
    from mlxcore.testing import build_test_model

    layers: dict[str, Any] = {"num_hidden_layers": 16} if size == "small" else {}
    text = build_test_model(arch, size=size, seed=seed, **layers)
    add_qwen3_5_vision(text, folder, seed=seed)


def _build_qwen3_5_moe(folder: Path, seed: int) -> None:
    _build_qwen3_5(folder, seed, arch="qwen3_5_moe")


def add_qwen3_5_vision(text: Path, folder: Path, *, seed: int = 0) -> None:
    """Write into ``folder`` the Qwen3.5 checkpoint at ``text`` (official layout, any
    tokenizer with Qwen's vision tokens) with a seeded vision tower added:
    ``model.visual.*`` tensors (PyTorch conv3d layout), ``vision_config``, the vision
    token ids and Qwen3.5's processor configuration."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    folder.mkdir(parents=True, exist_ok=True)
    for item in Path(text).iterdir():
        if item.is_file() and not item.name.startswith("."):
            shutil.copyfile(item, folder / item.name)
    config = json.loads((folder / "config.json").read_text())
    vocab = {
        t["content"]: t["id"]
        for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    }
    model_type = str(config["model_type"])  # qwen3_5 or qwen3_5_moe
    module = importlib.import_module(f"mlx_vlm.models.{model_type}")
    config.update({field: vocab[token] for field, token in _QWEN_SPECIAL.items()})
    hidden = int(config["text_config"]["hidden_size"])
    config["vision_config"] = _qwen3_vision_config(hidden, model_type)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(_qwen3_vision_preprocessor()))
    (folder / "video_preprocessor_config.json").write_text(
        json.dumps({**_qwen3_vision_preprocessor(), "fps": 2, "min_frames": 2, "max_frames": 8})
    )

    mx.random.seed(seed + 1)
    tower = module.VisionModel(module.VisionConfig.from_dict(config["vision_config"]))
    tensors = dict(mx.load(str(folder / "model.safetensors")))  # type: ignore[arg-type]
    for name, value in dict(tree_flatten(tower.parameters())).items():
        value = _spread(name, value)
        if name == "patch_embed.proj.weight":  # MLX (O, T, H, W, C) -> PyTorch (O, C, T, H, W)
            value = value.transpose(0, 4, 1, 2, 3)
        tensors[f"model.visual.{name}"] = value.astype(mx.float32)
    mx.eval(tensors)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "pt"})


def _qwen3_vl_config(token_ids: dict[str, int], eos: int, vocab_size: int) -> dict[str, Any]:
    # Qwen3-VL's published config layout (nested text and vision configs, interleaved
    # M-RoPE, deepstack from vision layers) at a tiny size.
    text = {
        "model_type": "qwen3_vl_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rope_theta": 5000000.0,
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
        "tie_word_embeddings": True,
        "eos_token_id": eos,
    }
    return {
        "model_type": "qwen3_vl",
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "tie_word_embeddings": True,
        "eos_token_id": eos,
        **token_ids,
        "text_config": text,
        # deepstack: both vision blocks feed the first two text layers
        "vision_config": _qwen3_vision_config(64, "qwen3_vl", deepstack=(0, 1)),
    }


def _build_qwen3_vl(folder: Path, seed: int) -> None:
    """A Qwen3-VL checkpoint: mlx-vlm's ``qwen3_vl.Model`` (Qwen3 text layers with
    interleaved M-RoPE, a vision tower with deepstack mergers) with seeded weights, the
    Qwen3 tokenizer, Qwen3.5's chat template (it renders image and video parts) and the
    Qwen3-VL processor fields."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import qwen3_vl

    vocab, token_ids, vocab_size = _write_qwen_tokenizer(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps(_qwen3_vision_preprocessor()))
    (folder / "video_preprocessor_config.json").write_text(
        json.dumps({**_qwen3_vision_preprocessor(), "fps": 2, "min_frames": 2, "max_frames": 8})
    )
    config = _qwen3_vl_config(token_ids, vocab["<|im_end|>"], vocab_size)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    mx.random.seed(seed)
    model_config = qwen3_vl.ModelConfig.from_dict(json.loads(json.dumps(config)))
    model = qwen3_vl.Model(model_config)
    flat = dict(tree_flatten(model.parameters()))
    weights = {name: _spread(name, value) for name, value in flat.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})


_BUILDERS = {
    "qwen2_vl": _build_qwen2_vl,
    "qwen2_5_vl": _build_qwen2_5_vl,
    "qwen3_5": _build_qwen3_5,
    "qwen3_5_moe": _build_qwen3_5_moe,
    "gemma3": _build_gemma3,
    "qwen3_vl": _build_qwen3_vl,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m mlxcore_vision.testing add-vision QWEN3_5_DIR OUT``: a Qwen3.5 VLM made
    from a Qwen3.5 text checkpoint (e.g. the MTP benchmark model) plus a small seeded
    vision tower."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m mlxcore_vision.testing")
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add-vision", help="add a vision tower to a Qwen3.5 checkpoint")
    add.add_argument("text", type=Path, help="Qwen3.5 checkpoint (official layout)")
    add.add_argument("out", type=Path, help="folder to write")
    add.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    add_qwen3_5_vision(args.text, args.out, seed=args.seed)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
