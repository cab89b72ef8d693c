"""What the core knows about a loaded model, handed to every model-dependent hook.

`ModelInfo` is plain data: plugins use it to decide whether they apply to a model
(a parser's `matches`, a speculative decoder that needs an MTP head, ...). It is
built once at load time by :mod:`mlxcore.models.loader`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length")
"""``config.json`` keys that give a model's context length, most common first."""


@attrs.frozen
class ModelInfo:
    """Facts about one loaded model.

    Attributes:
        path: the resolved local folder the weights were loaded from.
        model_type: ``config.json``'s ``model_type`` (e.g. ``"qwen3_5"``, ``"llama"``).
        config: the whole ``config.json`` as a dict (read-only by convention).
        chat_template: the chat template text (Jinja), or ``None`` if the model has none.
        vocab: token text -> id for every token of the tokenizer (special tokens included).
        eos_token_ids: the ids that end a generation.
        source: what the user asked for (a path, a repo id, a GGUF file).
        weight_keys: names of every tensor in the checkpoint's safetensors files, including
            ones the mlx-lm model class does not load (e.g. ``mtp.*``).
        reserved_bytes: memory the model will hold beyond the weights it has loaded (an
            expert cache that fills while serving); the engine's budget counts it as
            weights from the start.
        gauges: figures the plugin that loaded the model reports about it (an expert
            cache's hits and misses), merged into the engine's stats, ``/metrics``,
            ``/health`` and the dashboard; None when there are none.
        tokenizer: the loaded tokenizer (mlx-lm's ``TokenizerWrapper``), for plugins
            that need the vocabulary (constrained decoding, parsers); ``None`` in
            tests that build a ``ModelInfo`` by hand.
    """

    path: Path
    model_type: str
    config: dict[str, Any] = attrs.field(factory=dict, repr=False)
    chat_template: str | None = attrs.field(default=None, repr=False)
    vocab: dict[str, int] = attrs.field(factory=dict, repr=False)
    eos_token_ids: frozenset[int] = frozenset()
    source: str = ""
    weight_keys: frozenset[str] = attrs.field(default=frozenset(), repr=False)
    reserved_bytes: int = 0
    gauges: Callable[[], dict[str, float]] | None = attrs.field(default=None, repr=False, eq=False)
    tokenizer: Any = attrs.field(default=None, repr=False, eq=False)

    @property
    def context_length(self) -> int | None:
        """The model's own context length from ``config.json`` (or its ``text_config``)."""
        for section in (self.config, self.config.get("text_config")):
            if not isinstance(section, dict):
                continue
            for key in CONTEXT_KEYS:
                value = section.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return None

    def has_token(self, text: str) -> bool:
        """True when ``text`` is a single token of the vocabulary."""
        return text in self.vocab

    def template_mentions(self, *needles: str) -> bool:
        """True when the chat template contains every one of ``needles``."""
        template = self.chat_template or ""
        return all(n in template for n in needles)
