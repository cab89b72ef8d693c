"""The `qwen` plugin keeps Qwen chat templates prefix-stable across agent turns, so a
multi-turn tool-using session keeps hitting the prefix cache on a hybrid model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mlxcore.testing
from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore_qwen import stable_template

TEMPLATES = Path(mlxcore.testing.__file__).parent / "assets" / "chat-templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("name", ["Qwen3.5-4B.jinja", "Qwen-Qwen3-0.6B.jinja"])
def test_qwen_templates_are_rewritten(name: str) -> None:
    template = (TEMPLATES / name).read_text()
    stable = stable_template(template)
    assert stable is not None and stable != template
    assert "loop.index0 > ns.last_query_index" not in stable


def test_other_templates_are_left_alone() -> None:
    assert stable_template((TEMPLATES / "google-gemma-4-31B-it.jinja").read_text()) is None
    assert stable_template((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()) is None


def runtime(model: Path, *, with_plugin: bool) -> Runtime:
    pm = create_plugin_manager()
    enable = ("qwen",) if with_plugin else ()
    load_plugins(pm, PluginSelection(enable=enable, autoload=False))
    config = ServerConfig(model=str(model))
    return build_runtime(config, PluginHooks(pm))


def call(i: int) -> dict[str, Any]:
    args = {"city": f"City{i}"}
    fn = {"name": "get_weather", "arguments": args}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "function": fn}]}


def session_cached_fractions(rt: Runtime) -> list[tuple[int, int, int]]:
    """Replay an agent session; per turn: (prompt tokens, cached, previous history)."""
    from mlxcore.prompts import render_chat

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. " * 20},
        {"role": "user", "content": "Plan a trip."},
    ]
    turns = []
    previous = 0
    for i in range(4):
        rendered = render_chat(rt.tokenizer, messages, tools=[WEATHER])
        req = GenerationRequest(tuple(rendered.ids), 3, checkpoints=rendered.checkpoints())
        finish = next(e for e in rt.engine.stream(req) if isinstance(e, FinishEvent))
        turns.append((len(rendered.ids), finish.usage.cached_tokens, previous))
        previous = rendered.history_length or 0
        messages.append(call(i))
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": json.dumps({"t": i})})
        if i == 1:
            messages.append({"role": "user", "content": "Also check the next city."})
    return turns


def test_agent_session_keeps_hitting_the_prefix_cache(tiny_qwen3_5: Path) -> None:
    rt = runtime(tiny_qwen3_5, with_plugin=True)
    try:
        turns = session_cached_fractions(rt)
    finally:
        rt.engine.shutdown()
    for prompt, cached, previous in turns[1:]:
        assert cached >= previous > 0, turns
        assert cached / prompt > 0.6, turns


def test_without_the_plugin_the_user_text_turn_misses(tiny_qwen3_5: Path) -> None:
    rt = runtime(tiny_qwen3_5, with_plugin=False)
    try:
        turns = session_cached_fractions(rt)
    finally:
        rt.engine.shutdown()
    # turn 2 follows a user text after tool results: the template rewrites history
    _, cached, previous = turns[2]
    assert cached < previous, turns
