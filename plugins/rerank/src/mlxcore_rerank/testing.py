"""A small BERT cross-encoder for tests, built here: a WordPiece tokenizer trained on a
few sentences (BERT's own algorithm and special tokens, through ``tokenizers``) and a
``BertForSequenceClassification`` checkpoint with seeded random weights, saved under the
names a Hugging Face checkpoint uses."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any


def run_pieces(pieces: Generator[None, None, list[Any]]) -> list[Any]:
    """Run a job's pieces (a scoring or embedding generator) to the end, as the engine
    does, and return its result."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return list(done.value)


CORPUS = [
    "Paris is the capital of France and its largest city.",
    "The Eiffel Tower stands in Paris on the river Seine.",
    "Bananas are rich in potassium and grow in warm countries.",
    "Berlin is the capital of Germany; Madrid that of Spain.",
    "Which city is the capital of France? Which river runs through it?",
    "Cells make energy in their mitochondria; plants use light.",
]


TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 128}  # fmt: skip
MINILM_L6 = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
             "intermediate_size": 1536, "max_position_embeddings": 512}  # fmt: skip
"""The shape of the ms-marco MiniLM-L6 cross-encoders (for speed measurements)."""


def write_tokenizer(folder: Path) -> int:
    """A WordPiece tokenizer trained on :data:`CORPUS` (BERT's algorithm, special tokens
    and pair template), saved in ``folder``; returns its vocabulary size."""
    from tokenizers import BertWordPieceTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    words = BertWordPieceTokenizer(lowercase=True)
    words.train_from_iterator(CORPUS * 4, vocab_size=400, min_frequency=1)
    special = [(name, words.token_to_id(name)) for name in ("[CLS]", "[SEP]")]
    words.post_processor = TemplateProcessing(  # BERT's: [CLS] A [SEP] B [SEP], segments 0/1
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=special
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words._tokenizer,
        unk_token="[UNK]",
        sep_token="[SEP]",
        cls_token="[CLS]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )
    tokenizer.save_pretrained(str(folder))
    return int(tokenizer.vocab_size)


def bert_config(vocab_size: int, architecture: str, shape: dict[str, int] | None) -> dict[str, Any]:
    """A ``config.json`` for a BERT checkpoint of ``shape`` (default: tiny)."""
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": vocab_size,
        **(shape or TINY),
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    }


def build_cross_encoder(
    folder: Path, seed: int = 0, *, labels: int = 1, shape: dict[str, int] | None = None
) -> Path:
    """Write a cross-encoder of ``shape`` (default: tiny) into ``folder`` (created) and
    return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxcore_rerank.cross_encoder import CrossEncoder

    config = bert_config(write_tokenizer(folder), "BertForSequenceClassification", shape)
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    mx.random.seed(seed)
    model = CrossEncoder(config)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def build_encoder(folder: Path, seed: int = 0, *, pooling: str = "mean") -> Path:
    """Write a tiny BERT embedding model (``BertModel``, sentence-transformers' pooling
    ``mean`` or ``cls``) into ``folder`` (created) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxcore_rerank.encoder import Encoder

    config = bert_config(write_tokenizer(folder), "BertModel", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "1_Pooling").mkdir()
    modes = {
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
    }
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(modes))
    mx.random.seed(seed)
    model = Encoder(config)
    # saved as Hugging Face's BertModel names them: no prefix
    flat: dict[str, mx.array] = dict(tree_flatten(model.parameters()))
    weights = {key.removeprefix("model."): value for key, value in flat.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder
