"""Does a JSON schema admit a finite instance?

A schema can be valid and still describe only infinite values: ``{"type": "object",
"properties": {"a": {"$ref": "#"}}, "required": ["a"]}`` demands an object inside an
object without end. llguidance compiles such a schema, and the first tokens then make its
parser give up mid-generation; decoding it could never end with valid output anyway. This
module finds such schemas before a request is admitted, so they are a 400.

The check is the least fixpoint of "has a finite instance" over every subschema: a
subschema is finite when its ``type`` allows a scalar, an ``enum`` or ``const`` gives a
value, an object needs only finite required properties, an array needs only finite items
up to its ``minItems``, ``anyOf`` / ``oneOf`` has a finite branch, ``allOf`` only finite
branches, and a ``$ref`` points at a finite schema. Keywords it does not know are taken
as satisfiable (llguidance refuses what it cannot enforce).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

_CHILD_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_CHILD_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_CHILD_ONE = ("items", "additionalProperties", "contains", "not", "if", "then", "else")
_SCALARS = {"string", "number", "integer", "boolean", "null"}


def infinite_path(schema: Mapping[str, Any]) -> str | None:
    """``None`` when ``schema`` admits a finite JSON value; else the JSON pointer of the
    first subschema met that does not (where the recursion without end is)."""
    finite = _Finite(schema)
    return None if finite.holds(schema) else finite.explain()


class _Finite:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.nodes: dict[int, Any] = {}
        self.paths: dict[int, str] = {}
        self._collect(root, "#")
        self.known: dict[int, bool] = dict.fromkeys(self.nodes, False)
        changed = True
        while changed:
            changed = False
            for key, node in self.nodes.items():
                if not self.known[key] and self._finite(node):
                    self.known[key] = changed = True

    def _collect(self, node: Any, path: str) -> None:
        if id(node) in self.nodes:
            return
        self.nodes[id(node)] = node
        self.paths[id(node)] = path
        if not isinstance(node, Mapping):
            return
        for key in _CHILD_MAPS:
            found = node.get(key)
            if isinstance(found, Mapping):
                for name, child in found.items():
                    self._collect(child, f"{path}/{key}/{name}")
        for key in _CHILD_LISTS:
            found = node.get(key)
            if isinstance(found, list):
                for i, child in enumerate(found):
                    self._collect(child, f"{path}/{key}/{i}")
        for key in _CHILD_ONE:
            if key in node:
                self._collect(node[key], f"{path}/{key}")

    def holds(self, node: Any) -> bool:
        """True when ``node`` (a collected subschema) has a finite instance."""
        return self.known.get(id(node), True)

    def _resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def _finite(self, node: Any) -> bool:
        if isinstance(node, bool):
            return node
        if not isinstance(node, Mapping):
            return True
        if "$ref" in node:
            target = self._resolve(node["$ref"])
            if target is not None and not self.holds(target):
                return False
        if "enum" in node or "const" in node:
            return True
        for key, need in (("anyOf", any), ("oneOf", any), ("allOf", all)):
            branches = node.get(key)
            if isinstance(branches, list) and branches and not need(map(self.holds, branches)):
                return False
        kinds = node.get("type")
        if isinstance(kinds, str):
            kinds = [kinds]
        if not isinstance(kinds, list):
            kinds = ["object"] if "required" in node else ["array"] if "minItems" in node else []
            if not kinds:
                return True
        return any(self._kind_finite(node, kind) for kind in kinds)

    def _kind_finite(self, node: Mapping[str, Any], kind: Any) -> bool:
        if not isinstance(kind, str):
            return True  # not a type name: llguidance refuses the schema
        if kind in _SCALARS:
            return True
        if kind == "object":
            return all(self.holds(s) for s in self._required(node))
        if kind == "array":
            return all(self.holds(s) for s in self._minimum_items(node))
        return True

    def _required(self, node: Mapping[str, Any]) -> Iterator[Any]:
        properties = node.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        required = node.get("required")
        for name in required if isinstance(required, list) else []:
            if name in properties:
                yield properties[name]
            elif isinstance(node.get("additionalProperties"), Mapping):
                yield node["additionalProperties"]

    def _minimum_items(self, node: Mapping[str, Any]) -> Iterator[Any]:
        least = node.get("minItems", 0)
        if not isinstance(least, int) or least <= 0:
            return
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        for i in range(min(least, len(prefix))):
            yield prefix[i]
        if least > len(prefix) and "items" in node:
            yield node["items"]

    def explain(self) -> str:
        """The path of the first subschema met that has no finite instance."""
        node: Any = self.root
        seen: set[int] = set()
        while id(node) not in seen:
            seen.add(id(node))
            nxt = next((c for c in self._blocking(node) if not self.holds(c)), None)
            if nxt is None:
                break
            node = nxt
        return self.paths.get(id(node), "#")

    def _blocking(self, node: Any) -> Iterator[Any]:
        """The subschemas that make ``node`` infinite (candidates to follow)."""
        if not isinstance(node, Mapping):
            return
        if "$ref" in node:
            target = self._resolve(node["$ref"])
            if target is not None:
                yield target
        yield from self._required(node)
        yield from self._minimum_items(node)
        for key in ("allOf", "anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list):
                yield from branches
