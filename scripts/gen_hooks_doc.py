"""Write docs/hooks.md from the hook specifications in mlxcore/hookspecs.py.

Run `make docs` (or this script) after changing a hook; the test suite fails
when docs/hooks.md is out of date or a hook has no docstring.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from mlxcore import hookspecs

HEADER = """# Plugin hooks reference

Generated from `core/src/mlxcore/hookspecs.py` by `scripts/gen_hooks_doc.py`
(`make docs`); do not edit by hand. How hooks are called, in what order, and how
errors are reported: see the module docstring below and docs/writing-a-plugin.md.

"""


def hook_functions() -> list[tuple[str, object]]:
    """Every ``mlxcore_*`` hook specification, in source order."""
    members = [
        (name, fn)
        for name, fn in vars(hookspecs).items()
        if name.startswith("mlxcore_") and inspect.isfunction(fn)
    ]
    return sorted(members, key=lambda item: inspect.getsourcelines(item[1])[1])


def render() -> str:
    """The full text of docs/hooks.md."""
    parts = [HEADER, inspect.cleandoc(hookspecs.__doc__ or ""), "\n"]
    for name, fn in hook_functions():
        signature = str(inspect.signature(fn)).replace("'", "")
        doc = inspect.getdoc(fn) or ""
        parts.append(f"\n## `{name}`\n\n```python\ndef {name}{signature}\n```\n\n{doc}\n")
    return "".join(parts)


def main() -> int:
    target = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"
    target.write_text(render())
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
