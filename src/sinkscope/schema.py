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


def resolve_ref(node: Any) -> Any:
    """A schema node with its ``$ref`` (within this schema) followed; its own keys (a
    description, a default) kept beside the referenced ones."""
    if not isinstance(node, dict) or "$ref" not in node:
        return node
    target: Any = load_schema()
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{key: value for key, value in node.items() if key != "$ref"}}


def schema_defaults(section: str) -> dict[str, Any]:
    """The defaults the schema declares for the keys of one config section (``figures``,
    ``diagnostics``, ``generation``...); a copy the caller may change."""
    properties = resolve_ref(load_schema()["properties"][section]).get("properties", {})
    return {key: copy.deepcopy(sub["default"]) for key, sub in properties.items() if "default" in sub}
