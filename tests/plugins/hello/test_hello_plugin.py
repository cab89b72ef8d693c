"""The example third-party plugin in examples/hello-plugin, installed for real.

A module fixture builds and installs the distribution (as a user would) into a folder of
its own, put on this process's ``sys.path`` and the ``PYTHONPATH`` of the commands it
runs: only these tests see it. (Installed into the shared environment, it was visible to
every process the other test workers started, and one that started while the files
were being replaced failed to import it.) The tests then go through entry-point
discovery, the ``mlxcore`` command and the plugin facade exactly as a user's plugin
would.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from mlxcore.cli.main import build_parser
from mlxcore.cli.options import config_from_args
from mlxcore.errors import UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.model_info import ModelInfo
from mlxcore.parsers import ParsedDelta, ToolParser
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.testing.conformance import Case, ParserConformance, loaded_test_model

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "hello-plugin"
DIST = "mlxcore-hello"
PLUGIN_ENV = ("MLXCORE_PLUGINS", "MLXCORE_DISABLE_PLUGIN_AUTOLOAD")


def installer() -> list[str]:
    """The repository's uv, else uv on PATH, else this interpreter's pip."""
    bundled = REPO / ".tools" / "uv" / "bin" / "uv"
    uv = str(bundled) if bundled.exists() else shutil.which("uv")
    if uv is not None:
        return [uv, "pip"]
    return [sys.executable, "-m", "pip"]


def install_into(target: Path) -> None:
    """A fresh build of the example installed into ``target`` (no dependencies: mlxcore
    is already importable)."""
    cmd = installer()
    if cmd[0] != sys.executable:  # uv: rebuild even if a build is cached
        args = [*cmd, "install", "--python", sys.executable, "--target", str(target),
                "--no-deps", "--reinstall-package", DIST, str(EXAMPLE)]  # fmt: skip
    else:
        args = [*cmd, "install", "--target", str(target), "--no-deps", str(EXAMPLE)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stderr}"


INSTALLED: list[Path] = []
"""The folder the example is installed in, while this module's tests run."""


@pytest.fixture(scope="module")
def hello_installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """mlxcore-hello installed for this module's tests (this process and the commands
    they run), nowhere else."""
    target = tmp_path_factory.mktemp("hello-plugin")
    install_into(target)
    sys.path.insert(0, str(target))
    INSTALLED.append(target)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.modules.pop("mlxcore_hello", None)
        sys.path.remove(str(target))
        INSTALLED.remove(target)
        importlib.invalidate_caches()


@pytest.fixture
def hello_hooks(hello_installed: None) -> PluginHooks:
    """A plugin facade with built-ins and the hello plugin (enabled by name)."""
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("hello",), autoload=False))
    return PluginHooks(pm)


@pytest.fixture
def parser_cls(hello_hooks: PluginHooks) -> type[ToolParser]:
    """The parser class the installed plugin registers under ``hello``."""
    return hello_hooks.tool_parsers().get("hello")


def mlxcore(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``mlxcore`` command with this interpreter, plugin env vars cleared."""
    env = {k: v for k, v in os.environ.items() if k not in PLUGIN_ENV}
    if INSTALLED:
        inherited = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join([str(INSTALLED[-1]), *inherited])
    return subprocess.run(
        [sys.executable, "-m", "mlxcore", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def plugins_row(output: str, name: str) -> dict[str, str]:
    """The row of ``mlxcore plugins`` for plugin ``name``."""
    for line in output.splitlines():
        found = re.match(rf"{re.escape(name)}\s+(\S+)\s+(\S+)\s+(.+?)\s{{2,}}(.*)$", line)
        if found:
            keys = ("distribution", "version", "status", "hooks")
            return dict(zip(keys, found.groups(), strict=True))
    raise AssertionError(f"no row for {name!r} in:\n{output}")


class RecordList(logging.Handler):
    """Keeps the messages logged to the logger it is attached to.

    (``caplog`` listens on the root logger, which mlxcore's loggers may not reach
    once the CLI has set up logging in this process.)
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_parser(cls: type[ToolParser], pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    """Feed ``pieces`` to a fresh parser, then finish; (content, [(name, arguments)])."""
    parser = cls()
    total = ParsedDelta()
    for piece in pieces:
        total.extend(parser.feed(piece))
    total.extend(parser.finish())
    return total.content, [(call.name, call.arguments) for call in total.tool_calls]


def both_ways(cls: type[ToolParser], text: str) -> tuple[str, list[tuple[str, str]]]:
    """Parse ``text`` whole and one character at a time; assert both agree."""
    whole = cls().parse(text)
    result = whole.content, [(call.name, call.arguments) for call in whole.tool_calls]
    assert run_parser(cls, list(text)) == result
    return result


# -- discovery and the command line ---------------------------------------------------


def test_plugins_command_lists_hello_as_opt_in(hello_installed: None) -> None:
    version = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["version"]
    assert md.version(DIST) == version
    done = mlxcore("plugins")
    assert done.returncode == 0, done.stderr
    row = plugins_row(done.stdout, "hello")
    assert row["distribution"] == DIST
    assert row["version"] == version
    assert row["status"] == "installed (enable with --plugin)"
    assert {"addoption", "configure", "tool_parsers"} <= set(row["hooks"].split(", "))


def test_plugins_command_shows_hello_enabled_when_named(hello_installed: None) -> None:
    done = mlxcore("plugins", "--plugin", "hello")
    assert done.returncode == 0, done.stderr
    assert plugins_row(done.stdout, "hello")["status"] == "enabled"


def test_option_appears_in_help_only_when_enabled(hello_installed: None) -> None:
    enabled = mlxcore("generate", "--help", "--plugin", "hello")
    assert enabled.returncode == 0, enabled.stderr
    assert "plugin hello" in enabled.stdout
    assert "--hello-greeting" in enabled.stdout
    default = mlxcore("generate", "--help")
    assert default.returncode == 0, default.stderr
    assert "--hello-greeting" not in default.stdout


def test_autoload_skips_opt_in_plugin(hello_installed: None) -> None:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    assert not pm.has_plugin("hello")
    assert "hello" not in PluginHooks(pm).tool_parsers()


def test_enabled_plugin_registers_installed_parser(hello_hooks: PluginHooks) -> None:
    registry = hello_hooks.tool_parsers()
    assert "hello" in registry
    assert registry.plugin_of("hello") == "hello"
    module = sys.modules[registry.get("hello").__module__]
    assert module.__name__ == "mlxcore_hello"
    assert Path(module.__file__ or "").resolve().is_relative_to(INSTALLED[-1].resolve())


def test_option_flows_to_configure(hello_hooks: PluginHooks) -> None:
    parser, core_dests = build_parser(hello_hooks)
    args = parser.parse_args(["generate", "-p", "hi", "--hello-greeting", "good morning"])
    config = config_from_args(args, core_dests)
    assert config.option("hello_greeting") == "good morning"

    logger = logging.getLogger("mlxcore.plugins.hello")
    handler = RecordList()
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        hello_hooks.configure(config)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert any(m.startswith("good morning from the hello plugin") for m in handler.messages)

    empty = config_from_args(
        parser.parse_args(["generate", "-p", "x", "--hello-greeting", ""]), core_dests
    )
    with pytest.raises(UsageError, match="--hello-greeting"):
        hello_hooks.configure(empty)


# -- the parser -------------------------------------------------------------------------


def test_parses_call_whole_and_char_by_char(parser_cls: type[ToolParser]) -> None:
    text = 'Sure. <<call get_weather {"city": "Paris", "days": [1, 2]}>> Done.'
    assert both_ways(parser_cls, text) == (
        "Sure.  Done.",
        [("get_weather", '{"city": "Paris", "days": [1, 2]}')],
    )


def test_several_calls_and_markers_inside_json(parser_cls: type[ToolParser]) -> None:
    text = 'a<<call f {"s": "x>>y"}>>b<<call g {"n": {"m": 1}} >>'
    assert both_ways(parser_cls, text) == ("ab", [("f", '{"s": "x>>y"}'), ("g", '{"n": {"m": 1}}')])


def test_holds_back_only_undecided_text(parser_cls: type[ToolParser]) -> None:
    parser = parser_cls()
    assert parser.feed("a < b, then <").content == "a < b, then "
    assert not parser.feed("<ca")
    assert not parser.feed('ll f {"x"')
    delta = parser.feed(": 1}>> ok <<car")
    assert [(c.name, c.arguments) for c in delta.tool_calls] == [("f", '{"x": 1}')]
    assert delta.content == " ok <<car"


@pytest.mark.parametrize(
    "text",
    [
        '<<call f {"a": 1',  # unfinished: the generation stopped inside the call
        "<<call get_w",  # unfinished header
        "trailing <<ca",  # unfinished marker
        "<<call f {not json}>> and more",  # malformed arguments
        "<<call 42 {}>>",  # malformed name
        "<<caller said hi>>",  # not a call at all
        "<<call f [1]>>",  # arguments must be an object
    ],
)
def test_malformed_or_unfinished_call_is_content(parser_cls: type[ToolParser], text: str) -> None:
    assert both_ways(parser_cls, text) == (text, [])


# -- the conformance kit, as a third-party plugin author uses it ----------------------


def load_example_source() -> ModuleType:
    """The example's module imported from its source file under a private name.

    The kit's test classes need the parser class when the module is collected,
    before the ``hello_installed`` fixture installs the distribution; a private
    name keeps it apart from the installed ``mlxcore_hello`` the tests above load.
    """
    path = EXAMPLE / "src" / "mlxcore_hello" / "__init__.py"
    spec = importlib.util.spec_from_file_location("_mlxcore_hello_source", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HelloSource = load_example_source().HelloToolParser


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """A real tokenizer, so the kit also feeds every case token by token."""
    return loaded_test_model("qwen3").tokenizer


class TestHelloConformance(ParserConformance):
    """``hello`` through :class:`ParserConformance`: each case parsed whole, by character,
    in pieces of 2, 3 and 7 characters, in random pieces and token by token."""

    parser_class = HelloSource
    tokenizer_fixture = "qwen3_tokenizer"
    MARKERS = ("<<call",)
    CASES = [
        Case(
            "one-call-with-text-around",
            'Sure. <<call get_weather {"city": "Paris", "days": 3}>> Done.',
            content="Sure.  Done.",
            calls=[("get_weather", {"city": "Paris", "days": 3})],
        ),
        Case("end-marker-inside-string", '<<call f {"s": "x>>y"}>>', calls=[("f", {"s": "x>>y"})]),
        Case(
            "end-marker-inside-nested-string",
            '<<call f   {"a": [1, 2, {"b": "}>>"}]}>>',
            calls=[("f", {"a": [1, 2, {"b": "}>>"}]})],
        ),
        Case(
            "two-calls-with-text-between",
            'a<<call f {}>>b<<call g {"n": {"m": 1}} >>',
            content="ab",
            calls=[("f", {}), ("g", {"n": {"m": 1}})],
        ),
        Case(
            "three-calls-back-to-back",
            "<<call f {}>><<call f {}>><<call f {}>>",
            calls=[("f", {})] * 3,
        ),
        Case(
            "unicode-arguments",
            '<<call search {"query": "Zürich 🌧 日本"}>>',
            calls=[("search", {"query": "Zürich 🌧 日本"})],
        ),
        Case(
            "quotes-and-braces-in-strings",
            '<<call search {"query": "say \\"hi\\" {x} [y]"}>>',
            calls=[("search", {"query": 'say "hi" {x} [y]'})],
        ),
        Case("escaped-unicode", '<<call f {"a": "\\u00e9"}>>', calls=[("f", {"a": "é"})]),
        Case("empty-arguments", "<<call f {}>>", calls=[("f", {})]),
        Case(
            "dotted-dashed-name-and-null",
            '<<call ns.tool-name_2 {"x": null}>>',
            calls=[("ns.tool-name_2", {"x": None})],
        ),
        Case(
            "call-on-its-own-line",
            "line\n<<call f {}>>\nline",
            content="line\n\nline",
            calls=[("f", {})],
        ),
        Case("extra-angle-before-call", "<<<call f {}>>", content="<", calls=[("f", {})]),
        Case("no-call", "plain < text << and >> here", content="plain < text << and >> here"),
        Case("no-output", ""),
        Case("truncated-arguments", '<<call f {"a": 1', content='<<call f {"a": 1'),
        Case("truncated-name", "<<call get_w", content="<<call get_w"),
        Case("truncated-marker", "trailing <<ca", content="trailing <<ca"),
        Case("truncated-end-marker", "<<call f {}>", content="<<call f {}>"),
        Case(
            "malformed-arguments",
            "<<call f {not json}>> and more",
            content="<<call f {not json}>> and more",
        ),
        Case("malformed-name", "<<call 42 {}>>", content="<<call 42 {}>>"),
        Case("not-a-call-word", "<<caller said hi>>", content="<<caller said hi>>"),
        Case("arguments-not-an-object", "<<call f [1]>>", content="<<call f [1]>>"),
    ]


def test_matches_templates_that_mention_the_format(parser_cls: type[ToolParser]) -> None:
    template = "{% if tools %}Call a tool as <<call NAME {json}>>.{% endif %}"
    assert parser_cls.matches(ModelInfo(path=EXAMPLE, model_type="llama", chat_template=template))
    assert not parser_cls.matches(ModelInfo(path=EXAMPLE, model_type="llama", chat_template="x"))
    assert not parser_cls.matches(ModelInfo(path=EXAMPLE, model_type="llama"))
