"""``mlxcore parse``: raw model output in, the server's assistant message out, no model.

The command pushes the text through the real output pipeline with parsers loaded
from the plugins; whole and every chunking must print the same JSON.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlxcore.cli.main import main
from mlxcore.cli.parse_command import parse_text
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.testing.conformance import DEFAULT_TOOLS

CHUNK_SIZES = (1, 2, 3, 7, 13)
Q = '<|"|>'
HERMES = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Zürich \\"old\\" {town}", "days": 3}}\n'
    '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'
)
XML = (
    "I need the weather.\n</think>\n\nOne moment.\n\n<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>"
)
GEMMA = (
    "<|channel>thought\nWeather first.<channel|>"
    f"<|tool_call>call:get_weather{{city:{Q}Rome{Q},days:2}}<tool_call|>Checking."
)
MINIMAX = (
    'Look it up.\n</think>\n\n<minimax:tool_call>\n<invoke name="search">\n'
    '<parameter name="query">mlx</parameter>\n<parameter name="limit">5</parameter>\n'
    "</invoke>\n</minimax:tool_call>"
)
# (tool parser, reasoning parser, prompt tail, text)
SAMPLES = [
    ("hermes", "think", "", HERMES),
    ("hermes", "think", "", "<think>\nhi\n</think>\n\nJust text, a < b."),
    ("hermes", "none", "", 'Truncated <tool_call>\n{"name": "search", "argu'),
    ("qwen3_coder", "think", "<|im_start|>assistant\n<think>\n", XML),
    ("gemma4", "gemma4", "", GEMMA),
    ("minimax_m2", "minimax_m2", "]~b]ai\n<think>\n", MINIMAX),
]


@pytest.fixture(scope="module")
def hooks() -> PluginHooks:
    """Built-in and autoloaded plugins, as ``mlxcore parse`` loads them."""
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    return PluginHooks(pm)


def run_main(monkeypatch: pytest.MonkeyPatch, text: str, *args: str) -> int:
    """``mlxcore parse ARGS`` in this process with ``text`` on stdin; the exit code."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    return main(["parse", *args])


@pytest.mark.parametrize(("tool", "reasoning", "tail", "text"), SAMPLES, ids=lambda v: v[:12])
def test_every_chunking_prints_the_same_message(
    hooks: PluginHooks, tool: str, reasoning: str, tail: str, text: str
) -> None:
    def parse(size: int | None) -> str:
        message = parse_text(
            text,
            hooks,
            tool_parser=tool,
            reasoning_parser=reasoning,
            tools=DEFAULT_TOOLS,
            prompt_tail=tail,
            chunk_size=size,
        )
        return json.dumps(message, sort_keys=True)

    whole = parse(None)
    for size in CHUNK_SIZES:
        assert parse(size) == whole, f"chunk size {size}"


def test_hermes_message(hooks: PluginHooks) -> None:
    message = parse_text(HERMES, hooks, tool_parser="hermes", tools=DEFAULT_TOOLS)
    assert message["role"] == "assistant" and message["content"] == "Let me check."
    assert "reasoning_content" not in message
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]
    assert [(i, n, json.loads(a)) for i, n, a in calls] == [
        ("call_0", "get_weather", {"city": 'Zürich "old" {town}', "days": 3}),
        ("call_1", "search", {}),
    ]


def test_prompt_tail_decides_whether_output_starts_in_reasoning(hooks: PluginHooks) -> None:
    opened = parse_text(
        XML,
        hooks,
        tool_parser="qwen3_coder",
        reasoning_parser="think",
        tools=DEFAULT_TOOLS,
        prompt_tail="<think>\n",
    )
    assert opened["reasoning_content"] == "I need the weather."
    assert opened["content"] == "One moment."
    assert json.loads(opened["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Paris",
        "days": 3,
    }
    closed = parse_text(XML, hooks, tool_parser="qwen3_coder", reasoning_parser="think")
    assert "reasoning_content" not in closed
    assert closed["content"] == "I need the weather.\n\nOne moment."


def test_tools_type_the_arguments(hooks: PluginHooks) -> None:
    text = '<minimax:tool_call><invoke name="get_weather"><parameter name="days">4</parameter>'
    text += "</invoke></minimax:tool_call>"
    untyped = parse_text(text, hooks, tool_parser="minimax_m2")
    typed = parse_text(text, hooks, tool_parser="minimax_m2", tools=DEFAULT_TOOLS)
    assert json.loads(untyped["tool_calls"][0]["function"]["arguments"]) == {"days": "4"}
    assert json.loads(typed["tool_calls"][0]["function"]["arguments"]) == {"days": 4}


def test_truncated_call_is_content_not_dropped(hooks: PluginHooks) -> None:
    text = 'Sure.\n<tool_call>\n{"name": "search", "arguments": {"qu'
    message = parse_text(text, hooks, tool_parser="hermes", chunk_size=2)
    assert message == {"role": "assistant", "content": text}


def test_command_whole_and_chunked_print_identical_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": list(DEFAULT_TOOLS)}))
    args = ["--tool-call-parser", "gemma4", "--reasoning-parser", "gemma4", "--tools", str(tools)]
    outputs = []
    for extra in ([], *(["--chunk-size", str(n)] for n in CHUNK_SIZES)):
        assert run_main(monkeypatch, GEMMA, *args, *extra) == 0
        outputs.append(capsys.readouterr().out)
    assert len(set(outputs)) == 1
    message = json.loads(outputs[0])
    assert message["content"] == "Checking."
    assert message["reasoning_content"] == "Weather first."
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "city": "Rome",
        "days": 2,
    }


@pytest.mark.parametrize("flag", ["--tool-call-parser", "--reasoning-parser"])
def test_unknown_parser_exits_2_naming_the_known_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    args = {"--tool-call-parser": "hermes", flag: "nope"}
    argv = [x for pair in args.items() for x in pair]
    assert run_main(monkeypatch, "text", *argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} 'nope'" in err
    known = ("hermes", "qwen3_coder", "gemma4") if flag == "--tool-call-parser" else ("think",)
    assert all(name in err for name in known), err


def test_auto_is_refused_without_a_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(monkeypatch, "x", "--tool-call-parser", "auto") == 2
    assert "auto needs a model" in capsys.readouterr().err


def test_none_passes_text_through(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(monkeypatch, "<tool_call>x</tool_call>", "--tool-call-parser", "none") == 0
    assert json.loads(capsys.readouterr().out)["content"] == "<tool_call>x</tool_call>"


@pytest.mark.parametrize("size", ["0", "-3", "two"])
def test_bad_chunk_size_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], size: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        run_main(monkeypatch, "x", "--tool-call-parser", "hermes", "--chunk-size", size)
    assert exc.value.code == 2
    assert "--chunk-size" in capsys.readouterr().err


def test_bad_tools_file_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "tools.json"
    bad.write_text('{"tools": 3}')
    assert run_main(monkeypatch, "x", "--tool-call-parser", "hermes", "--tools", str(bad)) == 2
    assert "--tools" in capsys.readouterr().err


def test_real_command_reads_stdin(tmp_path: Path) -> None:
    """The installed command, as a user runs it (a subprocess, stdin piped)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("MLXCORE_PLUGINS", None)

    def run(*extra: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "mlxcore", "parse", "--tool-call-parser", "hermes", *extra],
            input=HERMES,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    whole = run()
    assert whole == run("--chunk-size", "3")
    assert [c["function"]["name"] for c in whole["tool_calls"]] == ["get_weather", "search"]
