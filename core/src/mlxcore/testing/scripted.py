"""A test plugin that makes a real model write a given text.

Small test models have random weights, so they never produce a tool call or a
thinking block on their own. Enabled with ``--plugin mlxcore.testing.scripted``,
this plugin adds a logits processor to any request whose body carries
``"test_script": "<text>"``: it forces the tokens of that text, one per step,
then the end-of-sequence token. Everything else is the real path: the real
model runs every forward pass, the engine batches and samples, and the output
pipeline parses what comes out, streaming and non-streaming.

``"test_script_then": "free"`` stops forcing after the text instead of forcing the
end-of-sequence token (the model, and other processors such as a constraint, go on).

``--test-script TEXT`` scripts every request that carries no script of its own: how the
agent end-to-end tests (``make agents-e2e``) make a random model answer a real client
(Codex, Claude Code) with a short, finished reply. ``--test-record FILE`` appends each
request's id and prompt token ids to ``FILE`` (one JSON object per line), so a test can
tell how much of each prompt an earlier one shared.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import attrs
import mlx.core as mx

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import OptionError
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, read_settings, setting

OPTION = "test_script"
THEN_OPTION = "test_script_then"


@attrs.frozen
class ScriptSettings:
    """The scripted plugin's one setting."""

    test_script: str | None = setting(
        None,
        metavar="TEXT",
        help="force this output on every request without its own test_script (tests only)",
    )
    test_record: str | None = setting(
        None,
        metavar="FILE",
        help="append each request's id and prompt token ids to FILE as JSON lines (tests only)",
    )


_server_script: str | None = None
"""``--test-script`` of this process (the plugin is for tests: one server per process)."""

_record: str | None = None
"""``--test-record`` of this process."""
_record_lock = threading.Lock()


class ScriptProcessor:
    """Forces ``script`` token by token after the prompt, then EOS forever."""

    def __init__(
        self, script: list[int], prompt_length: int, eos: int, free_after: bool = False
    ) -> None:
        self.script = script
        self.prompt_length = prompt_length
        self.eos = eos
        self.free_after = free_after

    def __call__(self, tokens: Any, logits: Any) -> Any:
        position = int(tokens.shape[-1]) - self.prompt_length
        if self.free_after and position >= len(self.script):
            return logits
        target = self.script[position] if 0 <= position < len(self.script) else self.eos
        # added, not substituted: what another processor ruled out (-inf) stays out, and
        # the model's own preference picks among the rest
        bias = mx.full(logits.shape, -1e9, dtype=logits.dtype).at[..., target].add(1e9)
        return logits + bias


@hookimpl
def mlxcore_addoption(parser: Any) -> None:
    """``--test-script``."""
    add_flags(parser, ScriptSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Keep ``--test-script`` for the requests that have no script."""
    global _server_script, _record
    settings = read_settings(config, ScriptSettings)
    _server_script, _record = settings.test_script, settings.test_record


@hookimpl
def mlxcore_request_options() -> list[str]:
    """``test_script``, ``test_script_then``."""
    return [OPTION, THEN_OPTION]


@hookimpl
def mlxcore_validate_options(options: dict[str, Any]) -> None:
    """``test_script`` must be text."""
    if OPTION in options and not isinstance(options[OPTION], str):
        raise OptionError(OPTION, "must be a string")
    if options.get(THEN_OPTION, "eos") not in ("eos", "free"):
        raise OptionError(THEN_OPTION, "must be eos or free")


@hookimpl
def mlxcore_logits_processors(request: GenerationRequest, info: ModelInfo) -> list[Any] | None:
    """Force the request's ``test_script`` text, if it has one (and record the prompt
    under ``--test-record``)."""
    if _record is not None:
        line = json.dumps({"request_id": request.request_id, "prompt": request.prompt_tokens})
        with _record_lock, open(_record, "a") as f:
            f.write(line + "\n")
    text = request.options.get(OPTION, _server_script)
    if not isinstance(text, str) or info.tokenizer is None:
        return None
    script = list(info.tokenizer.encode(text, add_special_tokens=False))
    eos = min(info.eos_token_ids) if info.eos_token_ids else 0
    free = request.options.get(THEN_OPTION) == "free"
    return [ScriptProcessor(script, len(request.prompt_tokens), eos, free)]
