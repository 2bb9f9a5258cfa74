"""The config schema (``schemas/config.schema.yaml``): loaded once, and the defaults it
declares, so that code reads a default from the one place that defines it."""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"


@lru_cache(maxsize=1)
def load_schema() -> dict:
    """The config's JSON schema (a dict; do not modify it)."""
    with open(SCHEMA_PATH) as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not ref:
        return node
    target: Any = load_schema()
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target


def schema_defaults(section: str) -> dict[str, Any]:
    """The defaults the schema declares for the keys of one config section (``figures``,
    ``diagnostics``, ``generation``...); a copy the caller may change."""
    properties = _resolve(load_schema()["properties"][section]).get("properties", {})
    return {key: copy.deepcopy(sub["default"]) for key, sub in properties.items() if "default" in sub}
