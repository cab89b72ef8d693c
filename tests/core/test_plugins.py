"""The plugin framework: discovery, selection, validation, registries, the facade."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest

from mlxcore.config import ServerConfig
from mlxcore.errors import DuplicateNameError, OptionError, PluginError, UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.model_info import ModelInfo
from mlxcore.plugins import (
    BUILTIN_PLUGINS,
    PluginSelection,
    create_plugin_manager,
    installed_plugins,
    load_plugins,
    plugin_statuses,
)
from mlxcore.resources import ModelResources

NAMED_PLUGINS = {"qwen35-mtp", "gemma4", "minimax", "specprefill"}


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path where a test writes local plugin modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write_plugin(folder: Path, name: str, body: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def load(*enable: str, block: tuple[str, ...] = (), autoload: bool = False) -> PluginHooks:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=enable, block=block, autoload=autoload))
    return PluginHooks(pm)


PARSER_PLUGIN = """
    from mlxcore import hookimpl
    from mlxcore.parsers.base import ToolParser, ParsedDelta

    class {cls}(ToolParser):
        name = "{parser_name}"
        def feed(self, text):
            return ParsedDelta(content=text)

    @hookimpl
    def mlxcore_tool_parsers():
        return [{cls}]
"""


def test_factory_returns_independent_managers() -> None:
    first, second = create_plugin_manager(), create_plugin_manager()
    assert first is not second
    load_plugins(first, PluginSelection(autoload=False))
    assert first.get_plugins() and not second.get_plugins()


def test_plugins_declare_the_request_fields_they_read() -> None:
    """``mlxcore_request_options``: what is read is known, so the rest can be reported."""
    pm = create_plugin_manager()
    load_plugins(
        pm, PluginSelection(enable=("mlxcore.testing.scripted", "specprefill"), autoload=False)
    )
    known = PluginHooks(pm).request_options()
    assert {"speculative", "explain_cache", "batched_prefill", "test_script"} <= known
    assert "specprefill" in known and "surely_unknown" not in known


def test_builtins_registered_first_and_offer_defaults() -> None:
    pm = create_plugin_manager()
    loaded = load_plugins(pm, PluginSelection(autoload=False))
    assert loaded == list(BUILTIN_PLUGINS)


def test_misspelt_hook_fails_naming_plugin_and_hook(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir,
        "typo_plugin",
        """
        from mlxcore import hookimpl

        @hookimpl
        def mlxcore_tool_parser():
            return []
        """,
    )
    with pytest.raises(PluginError) as err:
        load(name)
    message = str(err.value)
    assert "typo_plugin" in message
    assert "mlxcore_tool_parser" in message
    assert "did you mean 'mlxcore_tool_parsers'" in message


def test_unmarked_misspelt_hook_is_caught_too(plugin_dir: Path) -> None:
    name = write_plugin(plugin_dir, "unmarked_typo", "def mlxcore_configur(config):\n    pass\n")
    with pytest.raises(PluginError, match=r"unmarked_typo.*mlxcore_configur"):
        load(name)


def test_wrong_hook_argument_fails_naming_plugin(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir,
        "badargs",
        "def mlxcore_configure(config, nonsense):\n    pass\n",
    )
    with pytest.raises(PluginError, match="badargs"):
        load(name)


def test_plugin_import_error_names_plugin(plugin_dir: Path) -> None:
    name = write_plugin(plugin_dir, "broken_import", "raise RuntimeError('boom at import')\n")
    with pytest.raises(PluginError, match=r"broken_import.*boom at import"):
        load(name)


def test_duplicate_parser_names_fail_naming_both(plugin_dir: Path) -> None:
    a = write_plugin(
        plugin_dir, "parsers_a", PARSER_PLUGIN.format(cls="AlphaParser", parser_name="same")
    )
    b = write_plugin(
        plugin_dir, "parsers_b", PARSER_PLUGIN.format(cls="BetaParser", parser_name="same")
    )
    hooks = load(a, b)
    with pytest.raises(DuplicateNameError) as err:
        hooks.tool_parsers()
    message = str(err.value)
    assert "'same'" in message
    assert "parsers_a.AlphaParser" in message and "parsers_b.BetaParser" in message


def test_parsers_registry_lists_plugin_parser(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir, "one_parser", PARSER_PLUGIN.format(cls="OneParser", parser_name="one")
    )
    registry = load(name).tool_parsers()
    assert "one" in registry
    assert registry.plugin_of("one") == "one_parser"


def test_unknown_plugin_lists_installed() -> None:
    with pytest.raises(UsageError) as err:
        load("no-such-plugin")
    message = str(err.value)
    assert "no-such-plugin" in message
    for name in NAMED_PLUGINS:
        assert name in message


def test_named_plugins_are_installed_with_versions() -> None:
    found = installed_plugins()
    assert set(found) >= NAMED_PLUGINS
    for name in NAMED_PLUGINS:
        assert found[name].distribution == f"mlxcore-{name}"
        assert found[name].version[0].isdigit()


def test_opt_in_plugins_do_not_autoload_but_load_when_named() -> None:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    assert not pm.has_plugin("specprefill")
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("specprefill",), autoload=True))
    assert pm.has_plugin("specprefill")
    statuses = {row.name: row.status for row in plugin_statuses(pm)}
    assert statuses["specprefill"] == "enabled"
    assert statuses["qwen35-mtp"].startswith("installed")


def test_plugin_configure_refuses_incomplete_options() -> None:
    hooks = load("specprefill")
    with pytest.raises(UsageError, match="specprefill-draft-model"):
        hooks.configure(ServerConfig())


def test_block_builtin_and_conflicting_flags() -> None:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(block=("mlxcore.builtin.parsers",), autoload=False))
    assert not pm.has_plugin("mlxcore.builtin.parsers")
    with pytest.raises(UsageError, match="both enabled"):
        load("gemma4", block=("gemma4",))


def test_env_allow_list_and_autoload_switch() -> None:
    sel = PluginSelection.from_env(environ={"MLXCORE_PLUGINS": "gemma4, minimax"})
    assert sel.allow == ("gemma4", "minimax") and sel.autoload
    sel = PluginSelection.from_env(environ={"MLXCORE_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert not sel.autoload
    sel = PluginSelection.from_env(disable_autoload=True, environ={})
    assert not sel.autoload and sel.allow is None


def test_hook_exception_names_plugin(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir,
        "raiser",
        "def mlxcore_configure(config):\n    raise ValueError('bad setting')\n",
    )
    with pytest.raises(PluginError) as err:
        load(name).configure(ServerConfig())
    assert err.value.plugin == "raiser"
    assert "mlxcore_configure" in str(err.value) and "bad setting" in str(err.value)


def test_addoption_reaches_config(plugin_dir: Path) -> None:
    from mlxcore.cli.main import build_parser
    from mlxcore.cli.options import config_from_args

    name = write_plugin(
        plugin_dir,
        "with_option",
        """
        def mlxcore_addoption(parser):
            parser.add_argument("--with-option-level", type=int, default=3)
        """,
    )
    hooks = load(name)
    parser, core = build_parser(hooks)
    args = parser.parse_args(["generate", "--prompt", "hi", "--with-option-level", "7"])
    config = config_from_args(args, core)
    assert config.option("with_option_level") == 7
    assert "prompt" not in config.plugin_options
    group_titles = [
        g.title for g in parser._subparsers._group_actions[0].choices["generate"]._action_groups
    ]  # type: ignore[union-attr]
    assert "plugin with_option" in group_titles


def test_routes_hook_collects_handlers(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir,
        "routes_plugin",
        """
        from litestar import get

        @get("/hello")
        async def hello() -> str:
            return "hi"

        def mlxcore_routes(config):
            return [hello]
        """,
    )
    table = load(name).routes(ServerConfig())
    # the plugin's route joins the built-in OpenAI routes, each owned by its plugin
    assert "hello" in [h.handler_name for h in table.handlers] and len(table.handlers) > 1
    assert table.owner("GET", "/hello") == "routes_plugin"
    assert table.owner("POST", "/v1/chat/completions") == "mlxcore.builtin.openai"


def test_strategy_selection_prefers_plugin_and_honours_names(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir,
        "strategy_plugin",
        """
        from mlxcore.defaults.chunked_prefill import ChunkedPrefill

        class BigChunks(ChunkedPrefill):
            name = "big-chunks"

        def mlxcore_prefill_strategy(model, info, config):
            return BigChunks(model, step_size=4096)
        """,
    )
    hooks = load(name)
    info = ModelInfo(path=Path("."), model_type="llama")
    none = ModelResources()
    assert hooks.prefill_strategy(object(), info, ServerConfig(), none).name == "big-chunks"
    chosen = hooks.prefill_strategy(object(), info, ServerConfig(prefill_strategy="chunked"), none)
    assert chosen.name == "chunked"
    with pytest.raises(UsageError, match=r"--prefill-strategy.*nope.*big-chunks"):
        hooks.prefill_strategy(object(), info, ServerConfig(prefill_strategy="nope"), none)


def test_log_level_is_case_insensitive_and_leaves_root_alone() -> None:
    import logging

    from mlxcore.settings import log_level as _log_level

    assert _log_level("WARNING") == "warning"
    with pytest.raises(argparse.ArgumentTypeError):
        _log_level("loud")
    from mlxcore.cli.main import setup_logging

    root_level = logging.getLogger().level
    setup_logging("debug")
    assert logging.getLogger("mlxcore").level == logging.DEBUG
    assert logging.getLogger("uvicorn").level == logging.DEBUG
    assert logging.getLogger().level == root_level
    setup_logging("info")


REASONING_PLUGIN = """
    from mlxcore.parsers.base import ReasoningParser, ParsedDelta

    class Bracket(ReasoningParser):
        name = "bracket"
        @classmethod
        def matches(cls, info):
            return info.template_mentions("[[think]]")
        def feed(self, text):
            return ParsedDelta(reasoning=text)

    def mlxcore_reasoning_parsers():
        return [Bracket]
"""


def test_reasoning_parsers_hook_and_auto_selection(plugin_dir: Path) -> None:
    from mlxcore.parsers.selection import Parsers

    name = write_plugin(plugin_dir, "reasoning_plugin", REASONING_PLUGIN)
    hooks = load(name)
    assert "bracket" in hooks.reasoning_parsers()
    with_marker = ModelInfo(path=Path("."), model_type="x", chat_template="... [[think]] ...")
    without = ModelInfo(path=Path("."), model_type="x", chat_template="plain")
    chosen = Parsers.select(hooks, with_marker, "auto", "auto").reasoning
    assert chosen is not None and chosen.name == "bracket"
    assert Parsers.select(hooks, without, "none", "auto").reasoning is None
    assert Parsers.select(hooks, with_marker, "auto", "none").reasoning is None
    with pytest.raises(UsageError, match="no such parser"):
        Parsers.select(hooks, without, "auto", "nope")


def test_chat_template_hook_takes_the_first_rewrite(plugin_dir: Path) -> None:
    first = write_plugin(
        plugin_dir,
        "tpl_first",
        "def mlxcore_chat_template(info, template):\n    return template + ' one'\n",
    )
    second = write_plugin(
        plugin_dir,
        "tpl_second",
        "def mlxcore_chat_template(info, template):\n"
        "    return template + ' two' if 'one' in template else None\n",
    )
    hooks = load(first, second)
    info = ModelInfo(path=Path("."), model_type="x")
    # priority order: the plugin named last is called first; it sees "base" and passes
    assert hooks.chat_template(info, "base") == "base one"
    # firstresult: once a plugin rewrote the template, the later ones are not asked
    assert load(second, first).chat_template(info, "base") == "base one"


def test_validate_options_hook(plugin_dir: Path) -> None:
    name = write_plugin(
        plugin_dir,
        "opts_plugin",
        """
        from mlxcore.errors import OptionError

        def mlxcore_validate_options(options, config):
            keep = options.get("keep")
            if keep is not None and not 0 < keep <= 1:
                raise OptionError("keep", "must be in (0, 1]")
            if options.get("boom"):
                raise RuntimeError("bug in the plugin")
            if options.get("untyped"):
                raise ValueError("untyped", "not an OptionError")
        """,
    )
    hooks = load(name)
    hooks.validate_options({"keep": 0.5, "other": 1}, ServerConfig())
    with pytest.raises(OptionError) as err:
        hooks.validate_options({"keep": 2}, ServerConfig())
    assert (err.value.field, err.value.message) == ("keep", "must be in (0, 1]")
    with pytest.raises(PluginError, match=r"opts_plugin.*mlxcore_validate_options"):
        hooks.validate_options({"boom": True}, ServerConfig())
    # only the typed error is the client's fault; any other exception is the plugin's
    with pytest.raises(PluginError, match="not an OptionError"):
        hooks.validate_options({"untyped": True}, ServerConfig())


def test_plugin_subcommand_runs_with_common_flags(
    plugin_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxcore.cli.main import main

    write_plugin(
        plugin_dir,
        "cmd_plugin",
        """
        def run(args):
            print(f"greeting {args.who}")
            return 7

        def mlxcore_add_commands(subparsers):
            cmd = subparsers.add_parser("greet", help="say hello")
            cmd.add_argument("who")
            cmd.set_defaults(mlxcore_handler=run)
        """,
    )
    code = main(["greet", "world", "--plugin", "cmd_plugin", "--log-level", "WARNING"])
    assert code == 7
    assert "greeting world" in capsys.readouterr().out
