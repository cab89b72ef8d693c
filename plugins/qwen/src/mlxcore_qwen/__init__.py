"""mlxcore plugin ``qwen``: Qwen-family chat-template quirks.

The Qwen3 and Qwen3.5 templates find the last "real" user query
(``ns.last_query_index``) and render assistant turns after it with their
``<think>`` block, earlier ones without. When a conversation gains a new user
message, every assistant turn before it is re-rendered without reasoning, so
the history the previous turn cached is no longer a prefix of the new prompt
and prefix reuse silently stops hitting (the agent-session case: tool results,
then a user text). This plugin rewrites that condition so every historical
assistant turn renders the plain way, which is stable across turns; the
generation prompt (``<think>\\n``) is unchanged, so the model still thinks.
"""

from __future__ import annotations

import re

from mlxcore import hookimpl
from mlxcore.model_info import ModelInfo

QUIRK = re.compile(r"\{%-?\s*if\s+loop\.index0\s*>\s*ns\.last_query_index\s*(?:and[^%]*)?-?%\}")
"""The opening of the assistant-turn branch that depends on the last user query."""


def stable_template(template: str) -> str | None:
    """The template with the last-query branch disabled, or ``None`` if it has none."""
    if "ns.last_query_index" not in template:
        return None
    rewritten, count = QUIRK.subn("{%- if false %}", template)
    return rewritten if count else None


@hookimpl
def mlxcore_chat_template(info: ModelInfo, template: str) -> str | None:
    """Make Qwen-style templates render history the same way on every turn."""
    return stable_template(template)
