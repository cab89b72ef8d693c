"""Registry ratchet: every registered parser has a conformance corpus in the repo tests.

Every tool and reasoning parser that the built-in and autoloaded plugins register
must be the ``parser_class`` of some :class:`ParserConformance` subclass in
``tests/`` with at least :data:`MIN_CASES` cases (the kit then checks each one
whole and streamed at every chunking). Registering a parser without such tests
fails here, naming it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mlxcore.hooks import PluginHooks
from mlxcore.parsers.base import ToolParser
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.registry import Entry
from mlxcore.testing.conformance import CHUNK_SIZES, MODES, ParserConformance

TESTS = Path(__file__).resolve().parents[1]
MIN_CASES = 30
"""Fewest corpus cases a registered parser's conformance class may have."""


def corpus_modules() -> Iterator[ModuleType]:
    """The repo's test modules that use the conformance kit, imported (or already loaded)."""
    for path in sorted(TESTS.rglob("test_*.py")):
        if path == Path(__file__) or "ParserConformance" not in path.read_text(encoding="utf-8"):
            continue
        loaded = sys.modules.get(path.stem)
        if loaded is not None and Path(getattr(loaded, "__file__", "") or "") == path:
            yield loaded
            continue
        name = f"_ratchet_{path.parent.name}_{path.stem}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        yield sys.modules[name]


def conformance_classes(modules: Iterable[ModuleType]) -> list[type[ParserConformance]]:
    """The :class:`ParserConformance` subclasses with a ``parser_class`` in ``modules``."""
    found: dict[int, type[ParserConformance]] = {}
    for module in modules:
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, ParserConformance)
                and obj is not ParserConformance
                and getattr(obj, "parser_class", None) is not None
            ):
                found[id(obj)] = obj
    return list(found.values())


def registered_parsers() -> list[tuple[str, Entry[type]]]:
    """``(kind, entry)`` for every parser of the built-in and autoloaded plugins."""
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    hooks = PluginHooks(pm)
    return [
        *(("tool", e) for e in hooks.tool_parsers()),
        *(("reasoning", e) for e in hooks.reasoning_parsers()),
    ]


def shortfalls(
    parsers: Iterable[tuple[str, Entry[type]]],
    classes: Iterable[type[ParserConformance]],
    min_cases: int = MIN_CASES,
) -> list[str]:
    """One line per registered parser without a conformance class of ``min_cases`` cases."""
    by_parser: dict[type, list[type[ParserConformance]]] = {}
    for cls in classes:
        by_parser.setdefault(cls.parser_class, []).append(cls)
    problems = []
    for kind, entry in parsers:
        where = f"{kind} parser {entry.name!r} ({entry.describe()})"
        tests = by_parser.get(entry.item, [])
        if not tests:
            problems.append(f"{where}: no ParserConformance subclass in tests/ names it")
            continue
        best = max(tests, key=lambda c: len(c().cases()))
        count = len(best().cases())
        if count < min_cases:
            problems.append(f"{where}: {best.__qualname__} has {count} cases (< {min_cases})")
    return problems


@pytest.fixture(scope="module")
def classes() -> list[type[ParserConformance]]:
    return conformance_classes(corpus_modules())


def test_every_registered_parser_has_a_conformance_corpus(
    classes: list[type[ParserConformance]],
) -> None:
    parsers = registered_parsers()
    names = {(kind, e.name) for kind, e in parsers}
    assert {("tool", "hermes"), ("tool", "qwen3_coder"), ("reasoning", "think")} <= names
    problems = shortfalls(parsers, classes)
    assert not problems, "parsers without enough conformance tests:\n" + "\n".join(problems)


def test_the_ratchet_catches_a_parser_without_tests(
    classes: list[type[ParserConformance]],
) -> None:
    class Untested(ToolParser):
        name = "untested"

        def feed(self, text: str):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    entry: Entry[type] = Entry(name="untested", item=Untested, plugin="someone")
    (problem,) = shortfalls([("tool", entry)], classes)
    assert "'untested'" in problem and "no ParserConformance" in problem
    few = [c for c in classes if len(c().cases()) >= 1]
    assert few, "no conformance classes found at all"
    target = few[0].parser_class
    real: Entry[type] = Entry(name="x", item=target, plugin="p")
    assert shortfalls([("tool", real)], few, min_cases=10_000)


def test_kit_streams_at_the_required_chunk_sizes() -> None:
    """Whole, one character, and fixed pieces of 2, 3 and 7 characters (and more)."""
    assert {"whole", "chars", "chunks"} <= set(MODES)
    assert set(CHUNK_SIZES) >= {2, 3, 7}
