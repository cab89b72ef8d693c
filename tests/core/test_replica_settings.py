"""``--replica-name`` (the x-mlxcore-replica header) and the request fields vllm-router
adds to every chat request."""

from __future__ import annotations

import logging

import pytest

from mlxcore.builtin.openai import ROUTER_FIELDS, mlxcore_validate_options
from mlxcore.config import ServerConfig
from mlxcore.settings import header_value


def test_a_replica_name_must_be_a_header_value() -> None:
    assert header_value("mac-studio-2") == "mac-studio-2"
    for bad in ("", "a\r\nx-evil: 1", "é", "x" * 129):
        with pytest.raises(Exception, match="printable ASCII"):
            header_value(bad)


def test_router_fields_pass_quietly_at_their_neutral_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        mlxcore_validate_options(dict(ROUTER_FIELDS), ServerConfig())
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        mlxcore_validate_options({"skip_special_tokens": False}, ServerConfig())
    assert any("skip_special_tokens" in r.getMessage() for r in caplog.records)
