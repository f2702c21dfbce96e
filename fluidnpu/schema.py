"""JSON-schema checks with one-line, path-naming errors.

fastjsonschema is pure Python with no dependencies, so the same checks run on
a board's ARM cores as on a workstation.
"""

from __future__ import annotations

from functools import lru_cache
import json
from typing import Any, Callable

import fastjsonschema

from fluidnpu.errors import FluidError


@lru_cache(maxsize=None)
def _compiled(schema_json: str) -> Callable[[Any], Any]:
    return fastjsonschema.compile(json.loads(schema_json))


def check(schema: dict[str, Any], data: Any, what: str) -> None:
    """Raise FluidError('<what>: <problem>') if data does not match schema."""
    try:
        _compiled(json.dumps(schema, sort_keys=True))(data)
    except fastjsonschema.JsonSchemaValueException as exc:
        where = exc.name.replace("data.", "", 1) if exc.name != "data" else "top level"
        if exc.rule == "required" and isinstance(exc.value, dict):
            missing = [k for k in exc.definition.get("required", []) if k not in exc.value]
            raise FluidError(f"{what}: {where} is missing {', '.join(repr(k) for k in missing)}") from None
        msg = exc.message.replace(exc.name, "").strip()
        raise FluidError(f"{what}: {where} {msg}") from None
