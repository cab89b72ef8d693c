"""API keys and their limits without a server: the keys file's checks, the sliding
minute of requests and tokens, Retry-After."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcore.errors import UsageError
from mlxcore.server.keys import ApiKey, KeyTable, retry_after


def test_requests_per_minute_slide_with_the_window() -> None:
    key = ApiKey("k", b"s", requests_per_minute=2)
    assert key.admit(0.0) == 0 and key.admit(10.0) == 0
    assert key.admit(20.0) == pytest.approx(40.0)  # the first leaves the window at 60
    assert key.admit(60.5) == 0  # it left
    assert key.counts["limited"] == 1 and key.counts["requests"] == 3


def test_tokens_per_minute_wait_until_enough_tokens_left_the_window() -> None:
    key = ApiKey("k", b"s", tokens_per_minute=100)
    assert key.admit(0.0) == 0
    key.charge(70, 1.0)
    assert key.admit(2.0) == 0
    key.charge(50, 3.0)  # 120 in the window
    assert key.admit(4.0) == pytest.approx(57.0)  # free once the 70 of t=1 leave (t=61)
    assert key.admit(61.5) == 0
    assert retry_after(0.2) == "1" and retry_after(56.1) == "57"


def test_the_keys_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "keys.toml"
    good.write_text('[keys.a]\nkey = "sk-a"\nrequests_per_minute = 5\npriority = "high"\n')
    table = KeyTable.from_config(("sk-b",), str(good))
    assert table.find("sk-a") is not None and table.find("sk-b") is not None
    assert table.find("sk-c") is None and table.find("") is None
    found = table.find("sk-a")
    assert found is not None and (found.requests_per_minute, found.priority) == (5, "high")
    for text, message in [
        ("not toml [", "not TOML"),
        ("[other]\nx = 1\n", "needs \\[keys.NAME\\] tables"),
        ("[keys.a]\nrequests_per_minute = 5\n", "needs key"),
        ('[keys.a]\nkey = "k"\nrpm = 5\n', "unknown field"),
        ('[keys.a]\nkey = "k"\ntokens_per_minute = 0\n', "whole number >= 1"),
        ('[keys.a]\nkey = "k"\npriority = "urgent"\n', "priority must be one of"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(UsageError, match=message):
            KeyTable.from_config((), str(bad))
    with pytest.raises(UsageError, match="given twice"):
        KeyTable.from_config(("sk-a",), str(good))
    with pytest.raises(UsageError, match="No such file"):
        KeyTable.from_config((), str(tmp_path / "missing.toml"))
