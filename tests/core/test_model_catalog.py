"""``--model`` / ``--models-config`` parsing and per-model configuration (no model loads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcore.cli import main as cli_main
from mlxcore.cli import options
from mlxcore.cli.model_specs import served_models
from mlxcore.errors import UsageError
from mlxcore.hooks import PluginHooks
from mlxcore.models.catalog import as_flags, parse_model_arg, read_catalog
from mlxcore.models.default import DEFAULT_MODEL_NAME
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_model_arg_with_and_without_a_name(tmp_path: Path) -> None:
    named = parse_model_arg(f"small={tmp_path}")
    assert (named.name, named.source) == ("small", str(tmp_path))
    folder = tmp_path / "Qwen3-0.6B-4bit"
    folder.mkdir()
    assert parse_model_arg(str(folder)).name == "Qwen3-0.6B-4bit"
    assert parse_model_arg("Qwen/Qwen3-0.6B").name == "Qwen/Qwen3-0.6B"
    with pytest.raises(UsageError, match="NAME"):
        parse_model_arg("x=")


def test_a_models_file_with_every_field(tmp_path: Path) -> None:
    catalog = read_catalog(
        write(
            tmp_path,
            """
memory_budget = "12GB"
idle_unload = 600

[models.qwen]
source = "~/models/qwen"
aliases = ["gpt-4o", "main"]
plugins = ["specprefill"]
pinned = true
idle_unload = 0
max-num-seqs = 16
context_length = 8192
[models.qwen.options]
specprefill_keep = 0.3

[models.embed]
source = "Qwen/Qwen3-Embedding-0.6B"
task = "embed"
pooling = "mean"
""",
        )
    )
    assert catalog.memory_budget == "12GB" and catalog.idle_unload == 600
    qwen, embed = catalog.entries
    assert qwen.names == ("qwen", "gpt-4o", "main")
    assert qwen.plugins == ("specprefill",) and qwen.pinned and qwen.idle_unload == 0
    assert qwen.flags == (
        "--max-num-seqs", "16", "--max-model-len", "8192", "--specprefill-keep", "0.3"
    )  # fmt: skip
    assert (embed.task, embed.pooling, embed.flags) == ("embed", "mean", ())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[models]\n", "no \\[models.NAME\\]"),
        ("colour = 1\n[models.a]\nsource='x'\n", "unknown setting"),
        ("[models.a]\naliases=['b']\n", "source"),
        ("[models.a]\nsource='x'\ntask='speech'\n", "task must be"),
        ("[models.a]\nsource='x'\npinned='yes'\n", "pinned"),
        ("[models.a]\nsource='x'\nidle_unload=-1\n", "idle_unload"),
        ("[models.a]\nsource='x'\naliases=[1]\n", "aliases"),
        ("[models.a\n", "not valid TOML"),
    ],
)
def test_mistakes_in_a_models_file_name_the_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        read_catalog(write(tmp_path, text))


def test_missing_models_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        read_catalog(tmp_path / "absent.toml")


def test_flags_from_toml_values() -> None:
    assert as_flags({"a": True, "b": False, "c": [1, 2], "d": {"k": 1}}, "here") == (
        "--a", "--c", "1", "2", "--d", '{"k": 1}'
    )  # fmt: skip


def _served(argv: list[str]) -> object:
    """What ``mlxcore serve ARGV`` would serve, parsed as the CLI does."""
    pre = options.first_phase(argv)
    pm = create_plugin_manager()
    selection = PluginSelection.from_env(pre.plugins, pre.blocked_plugins, environ={})
    load_plugins(pm, selection)
    hooks = PluginHooks(pm)
    parser, core_dests = cli_main.build_parser(hooks)
    args = parser.parse_args(argv)
    config = options.config_from_args(args, core_dests)
    return served_models(config, hooks, args, core_dests, selection)


def test_the_default_model_is_served_under_its_human_name() -> None:
    (spec,) = _served(["serve"]).specs  # type: ignore[attr-defined]
    assert spec.name == DEFAULT_MODEL_NAME == "SmolLM2-135M-Instruct"
    assert spec.config.model is None


def test_each_model_gets_its_own_flags_over_the_servers(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        """
[models.b]
source = "/models/b"
max-num-seqs = 4
tool-call-parser = "hermes"
kv-cache-dtype = "int8"
""",
    )
    served = _served(
        ["serve", "/models/a", "--max-num-seqs", "8", "--models-config", str(config),
         "--model", "c=/models/c", "--models-memory-budget", "2GB"]
    )  # fmt: skip
    a, c, b = served.specs  # type: ignore[attr-defined]
    assert [s.name for s in (a, c, b)] == ["a", "c", "b"]
    assert (a.config.max_num_seqs, b.config.max_num_seqs, c.config.max_num_seqs) == (8, 4, 8)
    assert b.config.tool_call_parser == "hermes" and a.config.tool_call_parser == "auto"
    assert (a.config.kv_cache_dtype, b.config.kv_cache_dtype) == ("auto", "int8")
    assert (a.config.model, b.config.model, c.config.model) == (
        "/models/a",
        "/models/b",
        "/models/c",
    )
    assert served.memory_budget == 2 * 10**9  # type: ignore[attr-defined]


def test_a_bad_per_model_flag_names_the_model(tmp_path: Path) -> None:
    config = write(tmp_path, "[models.b]\nsource = '/m/b'\nmax-num-seqs = 0\n")
    with pytest.raises(UsageError, match=r"model 'b'.*positive integer"):
        _served(["serve", "/m/a", "--models-config", str(config)])
    config = write(tmp_path, "[models.b]\nsource = '/m/b'\nkv-cache-dtype = 'fp8'\n")
    with pytest.raises(UsageError, match=r"model 'b'.*fp8"):
        _served(["serve", "/m/a", "--models-config", str(config)])
    config = write(tmp_path, "[models.b]\nsource = '/m/b'\nno-such-flag = 1\n")
    with pytest.raises(UsageError, match=r"model 'b'.*no-such-flag"):
        _served(["serve", "/m/a", "--models-config", str(config)])
    config = write(tmp_path, "[models.b]\nsource = '/m/b'\nplugins = ['nope']\n")
    with pytest.raises(UsageError, match=r"model 'b'.*unknown plugin"):
        _served(["serve", "/m/a", "--models-config", str(config)])


def test_a_name_used_twice_is_refused() -> None:
    with pytest.raises(UsageError, match="used twice"):
        _served(["serve", "/m/a", "--model", "a=/m/other"])
