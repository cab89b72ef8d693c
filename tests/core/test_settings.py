"""Every setting is declared once: the flags are generated from the settings classes,
so parsing an empty command line gives exactly the declared defaults."""

from __future__ import annotations

import argparse
from typing import Any

import attrs
import pytest

from mlxcore.cli.main import build_parser
from mlxcore.cli.options import config_from_args
from mlxcore.config import ServerConfig
from mlxcore.settings import add_flags, flag_names, flag_of, read_settings
from mlxcore.speculative.settings import SpeculativeSettings
from mlxcore_qwen35_mtp import MTPSettings
from mlxcore_specprefill.options import PREFIX as SPECPREFILL_PREFIX
from mlxcore_specprefill.options import Settings as SpecPrefillSettings
from mlxcore_vision.settings import VisionSettings

NOT_FLAGS = {"model", "plugin_options"}


def serve_config(*argv: str) -> ServerConfig:
    parser, core_dests = build_parser(None)
    return config_from_args(parser.parse_args(["serve", *argv]), core_dests)


def test_every_server_setting_has_a_flag() -> None:
    missing = [
        f.name for f in attrs.fields(ServerConfig) if f.name not in NOT_FLAGS and flag_of(f) is None
    ]
    assert missing == []


def test_every_flag_is_its_fields_name_and_aliases_are_few(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A flag is ``--`` and its field's name; a second name is an alias listed here."""
    for field in attrs.fields(ServerConfig):
        names = flag_names(field)
        if names:
            assert names[0] == "--" + field.name.replace("_", "-"), field.name
    aliases = {f.name: flag_names(f)[1:] for f in attrs.fields(ServerConfig) if flag_names(f)[1:]}
    assert aliases == {"extra_models": ["--model"]}
    config = serve_config(
        "--default-max-tokens", "7", "--mlx-cache-limit", "1MB", "--responses-store-size", "0",
        "--model", "a=x", "--extra-models", "b=y",
    )  # fmt: skip
    assert (config.default_max_tokens, config.mlx_cache_limit) == (7, 10**6)
    assert config.responses_store_size == 0 and config.extra_models == ("a=x", "b=y")
    with pytest.raises(SystemExit):
        build_parser(None)[0].parse_args(["serve", "--help"])
    assert "--extra-models [NAME=]SOURCE, --model [NAME=]SOURCE" in capsys.readouterr().out


def test_serve_without_flags_is_the_declared_defaults() -> None:
    assert serve_config() == ServerConfig()


def test_a_flag_sets_its_field_and_a_bad_value_is_refused() -> None:
    config = serve_config("--max-num-seqs", "3", "--served-model-name", "a", "b")
    assert config.max_num_seqs == 3
    assert config.served_model_name == ("a", "b")
    with pytest.raises(SystemExit):
        serve_config("--max-num-seqs", "0")


class Options:
    """What a plugin reads its parsed flags from (``ServerConfig.option``)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def option(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


@pytest.mark.parametrize(
    ("cls", "prefix"),
    [(MTPSettings, ""), (VisionSettings, ""), (SpecPrefillSettings, SPECPREFILL_PREFIX)],
    ids=["qwen35-mtp", "vision", "specprefill"],
)
def test_plugin_settings_round_trip_through_their_flags(cls: type[Any], prefix: str) -> None:
    parser = argparse.ArgumentParser()
    dests = add_flags(parser, cls, prefix=prefix)
    assert dests and all(d.startswith(prefix) for d in dests)
    parsed = read_settings(Options(vars(parser.parse_args([]))), cls, prefix=prefix)
    assert parsed == cls()


def test_plugin_flags_reach_the_typed_settings() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, MTPSettings)
    add_flags(parser, SpeculativeSettings)
    args = parser.parse_args(["--num-speculative-tokens", "3", "--no-mtp-auto-off"])
    assert read_settings(Options(vars(args)), MTPSettings) == MTPSettings(mtp_auto_off=False)
    shared = read_settings(Options(vars(args)), SpeculativeSettings)
    assert (shared.tokens(1), shared.batch_limit(4)) == (3, 4)

    parser = argparse.ArgumentParser()
    add_flags(parser, SpecPrefillSettings, prefix=SPECPREFILL_PREFIX)
    args = parser.parse_args(["--no-specprefill-enabled", "--specprefill-keep", "0.5"])
    settings = read_settings(Options(vars(args)), SpecPrefillSettings, prefix=SPECPREFILL_PREFIX)
    assert (settings.enabled, settings.keep, settings.threshold) == (False, 0.5, 8192)
