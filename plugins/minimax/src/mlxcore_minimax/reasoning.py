"""The ``minimax_m2`` reasoning parser: ``<think>...</think>``.

The official MiniMax-M2 template ends every generation prompt with
``]~b]ai\\n<think>\\n``: thinking is always opened by the prompt, so the output
starts as reasoning (``prompt_opens_reasoning`` sees the open tag) and the
answer follows ``</think>``. A ``<minimax:tool_call>`` inside unclosed
reasoning ends it (a single special token, never prose).
"""

from __future__ import annotations

from mlxcore.model_info import ModelInfo
from mlxcore.parsers.think import TagReasoningParser
from mlxcore_minimax.tools import TOOL_CALL

AI_TURN = "]~b]ai"


class MiniMaxM2ReasoningParser(TagReasoningParser):
    """MiniMax-M2 ``<think>`` reasoning; matches the MiniMax-M2 chat template."""

    name = "minimax_m2"
    exit_markers = (TOOL_CALL,)
    exit_anywhere = True

    @classmethod
    def matches(cls, info: ModelInfo) -> bool:
        """The template has MiniMax's ``]~b]ai`` turn and handles ``</think>``."""
        return info.template_mentions(AI_TURN, "</think>")
