"""The config schema file as written (``schemas/config.schema.yaml``), read once, and the
defaults it declares.

Code that computes results reads its defaults here (the figures' and the diagnostics'):
its code digest then covers no cache policy or procedure, whose names and own keys
``sinkscope.schema`` adds to this file's schema for the config check.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "config.schema.yaml"


@lru_cache(maxsize=1)
def read_schema_file() -> dict:
    """The schema file as written (a dict; do not modify it)."""
    with open(SCHEMA_PATH) as handle:
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def follow_ref(node: Any, schema: dict) -> Any:
    """A node of ``schema`` with its ``$ref`` (within ``schema``) followed; its own keys (a
    description, a default) kept beside the referenced ones."""
    if not isinstance(node, dict) or "$ref" not in node:
        return node
    target: Any = schema
    for part in node["$ref"].removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{key: value for key, value in node.items() if key != "$ref"}}


def section_defaults(section: str, schema: dict | None = None) -> dict[str, Any]:
    """The defaults ``schema`` (the file's when None) declares for the keys of one config
    section (``figures``, ``diagnostics``...); a copy the caller may change."""
    schema = read_schema_file() if schema is None else schema
    properties = follow_ref(schema["properties"][section], schema).get("properties", {})
    return {key: copy.deepcopy(sub["default"]) for key, sub in properties.items() if "default" in sub}
