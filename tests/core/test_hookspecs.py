"""Every hook is documented (docstring and docs/hooks.md) and exercised by a test."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _gen_module():
    spec = importlib.util.spec_from_file_location(
        "gen_hooks_doc", REPO / "scripts" / "gen_hooks_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _gen_module()
HOOKS = GEN.hook_functions()


def test_there_are_hooks() -> None:
    names = {name for name, _ in HOOKS}
    assert {"mlxcore_tool_parsers", "mlxcore_decoder", "mlxcore_routes"} <= names


@pytest.mark.parametrize(("name", "fn"), HOOKS, ids=[n for n, _ in HOOKS])
def test_hook_docstring_says_when_and_shows_example(name: str, fn: object) -> None:
    doc = inspect.getdoc(fn) or ""
    assert len(doc.splitlines()[0]) > 10, f"{name} has no summary line"
    assert "When:" in doc, f"{name}'s docstring does not say when it is called"
    assert "Example::" in doc, f"{name}'s docstring has no example"


def test_docs_hooks_md_is_generated_and_current() -> None:
    current = (REPO / "docs" / "hooks.md").read_text()
    assert current == GEN.render(), "docs/hooks.md is out of date: run `make docs`"


@pytest.mark.parametrize(("name", "fn"), HOOKS, ids=[n for n, _ in HOOKS])
def test_every_hook_is_exercised_by_a_test(name: str, fn: object) -> None:
    this = Path(__file__).resolve()
    sources = [p.read_text() for p in (REPO / "tests").rglob("test_*.py") if p.resolve() != this]
    assert any(name in text for text in sources), f"no test mentions hook {name}"
