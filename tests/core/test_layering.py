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
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "mlxcore.engine": (
        "mlxcore.server",
        "mlxcore.cli",
        "mlxcore.hooks",
        "mlxcore.plugins",
        "mlxcore.builtin",
        "mlxcore.runtime",
    ),
    "mlxcore.speculative": (
        "mlxcore.server",
        "mlxcore.cli",
        "mlxcore.hooks",
        "mlxcore.plugins",
        "mlxcore.runtime",
    ),
    "mlxcore.models": ("mlxcore.server", "mlxcore.cli", "mlxcore.engine", "mlxcore.hooks"),
    "mlxcore.distributed": ("mlxcore.server", "mlxcore.cli", "mlxcore.hooks"),
    "mlxcore.parsers": ("mlxcore.server", "mlxcore.cli", "mlxcore.engine", "mlxcore.hooks"),
    "mlxcore.output": ("mlxcore.server", "mlxcore.cli", "mlxcore.hooks"),
    "mlxcore.structured": ("mlxcore.server", "mlxcore.cli", "mlxcore.hooks"),
    "mlxcore.runtime": ("mlxcore.server", "mlxcore.cli"),
    "mlxcore.hooks": ("mlxcore.server", "mlxcore.cli"),
    "mlxcore.media": ("mlxcore.server", "mlxcore.cli"),
    "mlxcore.server": ("mlxcore.cli",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(
    path: Path, *, package: str | None = None, top_level_only: bool = False
) -> Iterator[tuple[int, str]]:
    """(line, imported module) for each import in ``path`` (relative ones resolved
    against ``package``, by default the module's own package)."""
    tree = ast.parse(path.read_text())
    if package is None:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    stack: list[ast.AST] = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
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


def test_layers_point_one_way() -> None:
    violations = []
    for path in sources():
        name = module_name(path)
        for layer, banned in FORBIDDEN.items():
            if not _under(name, layer):
                continue
            for line, target in imports(path):
                if any(_under(target, b) for b in banned):
                    violations.append(f"{name}:{line} imports {target} (layer {layer})")
    assert violations == []


def test_no_import_cycles_at_module_level() -> None:
    """Module-level imports form no cycle (a cycle makes import order matter)."""
    graph: dict[str, set[str]] = {}
    for path in sources():
        name = module_name(path)
        targets = {t for _, t in imports(path, top_level_only=True) if _under(t, "mlxcore")}
        graph[name] = {t for t in targets if t != name and not _under(name, t)}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


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
