"""Tools the structured-output e2e tests force calls of (imported by name: pytest puts
this folder on ``sys.path``)."""

from __future__ import annotations

from typing import Any

TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
