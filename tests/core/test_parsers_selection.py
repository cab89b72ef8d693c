"""Auto-detection: ``Parsers.select(..., "auto", "auto")`` against real models and templates.

The test models carry the real tokenizers and official chat templates
(``build_test_model``), and their :class:`ModelInfo` comes from the real loader;
all installed plugins are loaded the way ``mlxcore serve`` loads them.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

import mlxcore.testing
from mlxcore.errors import UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.model_info import ModelInfo
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore.parsers.selection import Parsers
from mlxcore.parsers.think import ThinkReasoningParser
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.testing.conformance import find_chat_template, loaded_test_model

SHARED_TEMPLATES = Path(mlxcore.testing.__file__).parent / "assets" / "chat-templates"


def hooks(*, autoload: bool = True) -> PluginHooks:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=autoload))
    return PluginHooks(pm)


def names(chosen: Parsers) -> tuple[str, str]:
    return (
        chosen.tool.name if chosen.tool else "none",
        chosen.reasoning.name if chosen.reasoning else "none",
    )


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("qwen3", ("hermes", "think")),
        ("qwen3_5", ("qwen3_coder", "think")),
        ("llama", ("hermes", "none")),  # Qwen2.5 template: Hermes tools, no thinking
        ("gemma4_text", ("gemma4", "gemma4")),
    ],
)
def test_auto_picks_the_family_parsers_for_real_test_models(arch: str, expected) -> None:
    info = loaded_test_model(arch).info
    assert names(Parsers.select(hooks(), info, "auto", "auto")) == expected


def template_info(name: str) -> ModelInfo:
    """The Qwen3 test model's info with another family's official template."""
    text = find_chat_template(name, extra_dirs=[SHARED_TEMPLATES])
    if text is None:
        pytest.skip(f"chat template {name} not available")
    return attrs.evolve(loaded_test_model("qwen3").info, chat_template=text)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("MiniMax-M2.jinja", ("minimax_m2", "minimax_m2")),
        ("Qwen3-Coder.jinja", ("qwen3_coder", "none")),
        ("HuggingFaceTB-SmolLM3-3B.jinja", ("none", "think")),
        ("google-gemma-4-31B-it-interleaved.jinja", ("gemma4", "gemma4")),
    ],
)
def test_auto_with_other_official_templates(template: str, expected) -> None:
    assert names(Parsers.select(hooks(), template_info(template), "auto", "auto")) == expected


def test_builtins_alone_never_claim_gemma_or_minimax() -> None:
    only_builtins = hooks(autoload=False)
    gemma = loaded_test_model("gemma4_text").info
    assert names(Parsers.select(only_builtins, gemma, "auto", "auto")) == ("none", "none")
    minimax = template_info("MiniMax-M2.jinja")
    assert names(Parsers.select(only_builtins, minimax, "auto", "auto"))[0] == "none"


def test_no_template_no_parser() -> None:
    info = ModelInfo(path=Path("."), model_type="x")
    assert names(Parsers.select(hooks(), info, "auto", "auto")) == ("none", "none")


def test_override_flags_name_disable_and_refuse() -> None:
    h = hooks()
    info = loaded_test_model("qwen3").info
    chosen = Parsers.select(h, info, "qwen3_coder", "none")
    assert chosen.tool is Qwen3CoderToolParser and chosen.reasoning is None
    assert Parsers.select(h, info, "off", "think").reasoning is ThinkReasoningParser
    with pytest.raises(UsageError, match=r"hermes.*qwen3_coder|qwen3_coder.*hermes"):
        Parsers.select(h, info, "nope", "auto")


def test_parser_hooks_offer_every_parser() -> None:
    """mlxcore_tool_parsers / mlxcore_reasoning_parsers: plugins first, built-ins last."""
    h = hooks()
    tools = h.tool_parsers().names()
    assert tools[-2:] == ["qwen3_coder", "hermes"]
    assert {"gemma4", "minimax_m2"} <= set(tools)
    reasoning = h.reasoning_parsers().names()
    assert reasoning[-1] == "think" and {"gemma4", "minimax_m2"} <= set(reasoning)


def test_selected_classes_make_fresh_instances_per_request() -> None:
    chosen = Parsers.select(hooks(), loaded_test_model("qwen3").info, "auto", "auto")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    first, second = chosen.tool_parser(tools), chosen.tool_parser(tools)
    assert isinstance(first, HermesToolParser) and first is not second
    assert chosen.tool_parser(None) is None
    prompt = "<|im_start|>assistant\n<think>\n"
    reasoning = chosen.reasoning_parser(prompt)
    assert reasoning is not None and reasoning.starts_in_reasoning
