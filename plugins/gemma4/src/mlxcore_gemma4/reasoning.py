"""The ``gemma4`` reasoning parser: ``<|channel>thought\\n...<channel|>``.

Gemma 4 thinks in a ``thought`` channel. With thinking off, the official
template (google-gemma-4-31B-it.jinja) ends the generation prompt with an empty
``<|channel>thought\\n<channel|>``, so the output starts as content; with
thinking on the model opens the channel itself. A channel labelled
``content``/``final`` is the answer, shown as content without its label.
A ``<|tool_call>`` inside an unclosed thought ends the thought (it is a single
control token: the model cannot be merely mentioning it). Turn and media
markers are dropped.
"""

from __future__ import annotations

from mlxcore.model_info import ModelInfo
from mlxcore.parsers.think import TagReasoningParser
from mlxcore_gemma4.tools import CHANNEL, CHANNEL_END, CONTROL_TOKENS, TOOL_CALL


class Gemma4ReasoningParser(TagReasoningParser):
    """Gemma 4 thought channel. Matches models whose chat template writes
    ``<|channel>`` or whose vocabulary has the ``<|channel>``/``<channel|>`` tokens."""

    name = "gemma4"
    control_tokens = CONTROL_TOKENS
    open_tag = CHANNEL
    close_tag = CHANNEL_END
    after_close = ""
    reasoning_labels = frozenset({"thought"})
    exit_markers = (TOOL_CALL,)
    exit_anywhere = True
    drop_markers = CONTROL_TOKENS

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The Gemma 4 template, or the Gemma 4 channel tokens."""
        if info.template_mentions(CHANNEL, CHANNEL_END):
            return True
        return info.has_token(CHANNEL) and info.has_token(CHANNEL_END)
