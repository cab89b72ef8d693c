"""The core's layers point one way, and no module imports itself back.

Read statically from the source (every ``import`` and ``from ... import``, also the
ones inside functions; imports under ``if TYPE_CHECKING:`` are annotations only and
are skipped), so the test sees a violation whether or not a code path runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import mlxcore

PACKAGE = Path(mlxcore.__file__).parent

# A package on the left may not import anything under the names on the right.
UP = ("mlxcore.server", "mlxcore.cli", "mlxcore.bench")
"""The front ends and tools: nothing below them imports them."""
PLUGIN_SIDE = ("mlxcore.hooks", "mlxcore.plugins", "mlxcore.builtin", "mlxcore.runtime")
"""The plugin machinery and the built-in plugins: the libraries they use do not import them."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "mlxcore.engine": (*UP, *PLUGIN_SIDE, "mlxcore.request_builder", "mlxcore.defaults"),
    "mlxcore.defaults": (*UP, *PLUGIN_SIDE, "mlxcore.request_builder"),
    "mlxcore.speculative": (*UP, *PLUGIN_SIDE, "mlxcore.request_builder"),
    "mlxcore.models": (*UP, "mlxcore.engine", "mlxcore.hooks", "mlxcore.builtin"),
    "mlxcore.distributed": (*UP, "mlxcore.hooks", "mlxcore.builtin"),
    "mlxcore.parsers": (*UP, "mlxcore.engine", "mlxcore.hooks", "mlxcore.builtin"),
    "mlxcore.output": (*UP, "mlxcore.hooks", "mlxcore.builtin"),
    "mlxcore.structured": (*UP, "mlxcore.hooks", "mlxcore.builtin"),
    "mlxcore.thinking": (*UP, *PLUGIN_SIDE, "mlxcore.request_builder", "mlxcore.engine"),
    "mlxcore.runtime": (*UP, "mlxcore.builtin", "mlxcore.request_builder"),
    "mlxcore.request_builder": (*UP, "mlxcore.builtin"),
    "mlxcore.tool_grammar": (*UP, *PLUGIN_SIDE, "mlxcore.request_builder"),
    "mlxcore.hooks": (*UP, "mlxcore.builtin"),
    "mlxcore.media": (*UP, "mlxcore.builtin"),
    "mlxcore.builtin": ("mlxcore.cli", "mlxcore.bench"),
    "mlxcore.bench": ("mlxcore.cli", "mlxcore.server", "mlxcore.builtin"),
    "mlxcore.server": ("mlxcore.cli", "mlxcore.bench"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(
    path: Path,
    *,
    package: str | None = None,
    top_level_only: bool = False,
    annotations: bool = False,
) -> Iterator[tuple[int, str]]:
    """(line, imported module) for each import in ``path`` (relative ones resolved
    against ``package``, by default the module's own package; ``annotations``: also
    those under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    if package is None:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    stack: list[ast.AST] = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if _type_checking_only(node) and not annotations:
            continue
        if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield node.lineno, full if _is_module(full) else base
        stack.extend(ast.iter_child_nodes(node))


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").exists() or (PACKAGE.parent / rel).is_dir()


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def violations(name: str, found: Iterator[tuple[int, str]]) -> list[str]:
    """The imports in ``found`` (line, module) that module ``name`` may not make."""
    out = []
    for line, target in found:
        for layer, banned in FORBIDDEN.items():
            if _under(name, layer) and any(_under(target, b) for b in banned):
                out.append(f"{name}:{line} imports {target} (layer {layer})")
    return out


def test_layers_point_one_way() -> None:
    found = [v for path in sources() for v in violations(module_name(path), imports(path))]
    assert found == []


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("mlxcore.builtin.strategies", "mlxcore.cli.options"),
        ("mlxcore.builtin.openai.chat", "mlxcore.bench.runner"),
        ("mlxcore.bench.options", "mlxcore.cli.options"),
        ("mlxcore.bench.agent", "mlxcore.builtin.strategies"),
        ("mlxcore.defaults.decoder", "mlxcore.builtin.strategies"),
        ("mlxcore.request_builder", "mlxcore.server.errors"),
    ],
)
def test_an_upward_import_is_a_violation(tmp_path: Path, module: str, target: str) -> None:
    """The rows for builtin, bench, the defaults and the request builder catch what they
    must (the import the issue found, bench -> cli, among them)."""
    source = tmp_path / "mod.py"
    source.write_text(f"def f():\n    from {target} import x\n")
    package = module.rpartition(".")[0]
    assert violations(module, imports(source, package=package)) == [
        f"{module}:2 imports {target} (layer {next(k for k in FORBIDDEN if _under(module, k))})"
    ]


def test_no_import_cycles_at_module_level() -> None:
    """Module-level imports form no cycle (a cycle makes import order matter)."""
    graph: dict[str, set[str]] = {}
    for path in sources():
        name = module_name(path)
        targets = {t for _, t in imports(path, top_level_only=True) if _under(t, "mlxcore")}
        graph[name] = {t for t in targets if t != name and not _under(name, t)}
    assert cycles(graph) == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets (module -> modules it imports)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


CYCLE_FREE = ("mlxcore.engine", "mlxcore.structured")
"""Packages whose modules import each other one way only, counting every import: inside
functions and for annotations too (a cycle there means two modules that cannot be read,
or changed, one without the other)."""


def package_graph(package: str, files: list[Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports, any way at all."""
    graph: dict[str, set[str]] = {}
    for path in files if files is not None else sources():
        name = module_name(path)
        if not _under(name, package):
            continue
        targets = {t for _, t in imports(path, annotations=True) if _under(t, package)}
        graph[name] = {t for t in targets if t != name and not _under(name, t)}
    return graph


@pytest.mark.parametrize("package", CYCLE_FREE)
def test_no_import_cycle_inside_engine_or_structured(package: str) -> None:
    assert cycles(package_graph(package)) == []


def test_the_cycle_rule_sees_function_and_annotation_imports(tmp_path: Path) -> None:
    """Two modules that import each other only inside a function and under
    ``TYPE_CHECKING`` are a cycle for the rule (they are none for Python at import)."""
    root = tmp_path / "mlxcore" / "engine"
    root.mkdir(parents=True)
    (root / "a.py").write_text("def f():\n    from mlxcore.engine import b\n")
    (root / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlxcore.engine.a import f\n"
    )
    graph: dict[str, set[str]] = {}
    for path in (root / "a.py", root / "b.py"):
        name = "mlxcore.engine." + path.stem
        found = {t for _, t in imports(path, package="mlxcore.engine", annotations=True)}
        graph[name] = {t if t != "mlxcore.engine" else "mlxcore.engine.b" for t in found}
    assert cycles(graph) == [["mlxcore.engine.a", "mlxcore.engine.b", "mlxcore.engine.a"]]


@pytest.mark.parametrize("banned", ["mlxcore.server", "mlxcore.hooks", "mlxcore.cli"])
def test_the_layering_check_can_fail(tmp_path: Path, banned: str) -> None:
    """The scanner sees a plain, a function-level and a relative import, and skips
    annotations-only ones."""
    source = tmp_path / "mod.py"
    leaf = banned.rpartition(".")[2]
    source.write_text(
        f"import {banned}\n"
        f"def f():\n    from {banned} import x\n"
        f"from .. import {leaf}\n"
        f"if TYPE_CHECKING:\n    import {banned}.hidden\n"
    )
    found = [t for _, t in imports(source, package="mlxcore.engine")]
    assert len(found) == 3 and all(_under(t, banned) for t in found)
