"""JSON-schema checks with one-line, path-naming errors.

fastjsonschema is pure Python with no dependencies, so the same checks run on
a board's ARM cores as on a workstation. A schema node may carry a "form" (a
few words showing what belongs there, e.g. '{"value": <integer>, "source": "..."}'):
fastjsonschema ignores it, and an error at that node quotes it, so the user sees
the expected form beside what is wrong.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import fastjsonschema

from fluidnpu.errors import FluidError


@cache
def _compiled(schema_json: str) -> Callable[[Any], Any]:
    return fastjsonschema.compile(json.loads(schema_json))


def _non_finite(data: Any, where: str = "") -> Iterator[str]:
    """Paths of NaN and infinite numbers: Python's json reads NaN/Infinity, JSON has neither, and
    every bound of a schema compares false with NaN, so without this a NaN passes any range."""
    if isinstance(data, float) and not math.isfinite(data):
        yield where or "top level"
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from _non_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _non_finite(v, f"{where}[{i}]")


def check(schema: dict[str, Any], data: Any, what: str, at: str = "") -> None:
    """Raise FluidError('<what>: <problem>') if data does not match schema; `at` names where `data`
    sits in its file (e.g. 'devices[2]'), for a part checked on its own."""
    bad = next(_non_finite(data, at), None)
    if bad is not None:
        raise FluidError(f"{what}: {bad} must be a finite number (NaN and Infinity are not JSON numbers)")
    try:
        _compiled(json.dumps(schema, sort_keys=True))(data)
    except fastjsonschema.JsonSchemaValueException as exc:
        sub = exc.name.replace("data", "", 1).lstrip(".")
        where = f"{at}.{sub}" if at and sub else (at or sub or "top level")
        form = exc.definition.get("form") if isinstance(exc.definition, dict) else None
        expected = f" (expected {form})" if form else ""
        if exc.rule == "required" and isinstance(exc.value, dict):
            missing = [k for k in exc.definition.get("required", []) if k not in exc.value]
            raise FluidError(f"{what}: {where} is missing {', '.join(repr(k) for k in missing)}{expected}") from None
        msg = exc.message.replace(exc.name, "").strip()
        got = "" if exc.rule in ("required", "additionalProperties") else f", got {json.dumps(exc.value)[:40]}"
        raise FluidError(f"{what}: {where} {msg}{got}{expected}") from None


def check_one_of(kinds: dict[str, dict[str, Any]], key: str, default: str, data: Any, what: str, at: str) -> str:
    """Check `data` against the schema its `key` field names (absent: `default`) and return that kind.

    Where a JSON schema would say oneOf and, on a mismatch, only "must be valid exactly by one
    definition (0 matches found)", this names the kind it took and the field that is wrong."""
    if not isinstance(data, dict):
        raise FluidError(f"{what}: {at} must be an object, got {json.dumps(data)[:40]}")
    kind = data.get(key, default)
    if kind not in kinds:
        raise FluidError(f"{what}: {at}.{key} must be one of {', '.join(map(json.dumps, kinds))}, "
                         f"got {json.dumps(kind)[:40]}")
    check(kinds[kind], data, f"{what}", at=f"{at} ({key} {kind})")
    return kind
