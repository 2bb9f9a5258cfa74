"""The config schema: the schema file (``sinkscope.schemafile``) with what the registries
declare filled in, and the defaults it declares, so that code reads a default from the
one place that defines it.

A cache policy or generation procedure is named in one place, its row of
``sinkscope.options.CACHE_POLICY_TABLE`` or ``PROCEDURE_TABLE``: ``load_schema`` lists
those names in the enums of ``generation.cache_policy`` and ``generation.procedure``
(each described by its ``follows``), and adds every key one of them declares
(``OptionSpec``: its type, choices, default and description) under ``generation:``, which
it then closes to other keys. The file itself names none of them, and leaves
``generation:`` open to their keys, so that Snakemake's own check against the file
(``rules/common.smk``, after ``load_study`` checked the config against this schema)
accepts them.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from sinkscope.options import (
    CACHE_POLICY_TABLE,
    PROCEDURE_TABLE,
    SELF_FORCING_PROCEDURE,
    OptionSpec,
    option_owners,
    procedures_running,
)
from sinkscope.schemafile import SCHEMA_PATH, follow_ref, read_schema_file, section_defaults

__all__ = ["SCHEMA_PATH", "load_schema", "registered_nodes", "resolve_ref", "schema_defaults"]

# JSON schema's name of a declared key's type (the type of its default; None: any type).
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", tuple: "array"}


def load_schema() -> dict:
    """The config's JSON schema, the registries' names and keys filled in (a dict; do not
    modify it). The same dict while the registries stay the same."""
    return _filled(json.dumps(registered_nodes()))


@lru_cache(maxsize=8)
def _filled(registered: str) -> dict:
    schema = copy.deepcopy(read_schema_file())
    generation = schema["$defs"]["generation"]
    properties = generation["properties"]
    for key, node in json.loads(registered).items():
        if key in ("cache_policy", "procedure"):
            written = properties[key]
            properties[key] = {
                **written,
                **node,
                "description": f"{written['description'].rstrip()} {node['description']}",
            }
        elif key in properties:
            raise ValueError(f"generation.{key}, declared by {option_owners()[key][1]!r}, is a key of {SCHEMA_PATH}")
        else:
            properties[key] = node
    generation["additionalProperties"] = False
    return schema


def registered_nodes() -> dict[str, dict[str, Any]]:
    """What the registries add to ``generation:``: the enums of ``cache_policy`` and
    ``procedure`` with the words that list them (appended to the file's description), and
    the node of every key a policy or procedure declares."""
    policies = [f"{name} ({spec.follows}{_where_run(name)})" for name, spec in CACHE_POLICY_TABLE.items()]
    procedures = [f"{name} ({spec.follows}{_brings(name)})" for name, spec in PROCEDURE_TABLE.items()]
    nodes: dict[str, dict[str, Any]] = {
        "cache_policy": {"enum": [*CACHE_POLICY_TABLE, None], "description": "; ".join(policies) + "."},
        "procedure": {"enum": list(PROCEDURE_TABLE), "description": "; ".join(procedures) + "."},
    }
    for key, (_, owner, option) in option_owners().items():
        nodes[key] = _option_node(owner, option)
    return nodes


def _where_run(policy: str) -> str:
    """'; procedure X only' for a policy that the default procedure does not run."""
    running = procedures_running(policy)
    return "" if SELF_FORCING_PROCEDURE in running else f"; procedure {' or '.join(running)} only"


def _brings(procedure: str) -> str:
    """What a procedure imposes beyond its calls: its own cache, one prompt, no edits."""
    spec = PROCEDURE_TABLE[procedure]
    return "".join(
        words
        for words, applies in (
            (f"; its cache_policy {spec.cache_policy}", spec.cache_policy is not None),
            ("; one prompt a video", spec.one_prompt),
            ("; no interventions", not spec.supports_interventions),
        )
        if applies
    )


def _option_node(owner: str, option: OptionSpec) -> dict[str, Any]:
    """A declared key's node: its choices (and null, its default) or the type of its default."""
    described = f"{owner}: {option.description}"
    if option.choices:
        return {
            "enum": [*option.choices, None],
            "default": None,
            "description": f"{described} null = {option.default}.",
        }
    typed = {"type": _JSON_TYPES[type(option.default)]} if type(option.default) in _JSON_TYPES else {}
    return {**typed, "default": option.default, "description": described}


def resolve_ref(node: Any) -> Any:
    """A schema node with its ``$ref`` (within this schema) followed; its own keys (a
    description, a default) kept beside the referenced ones."""
    return follow_ref(node, load_schema())


def schema_defaults(section: str) -> dict[str, Any]:
    """The defaults the schema declares for the keys of one config section (``figures``,
    ``diagnostics``, ``generation``...); a copy the caller may change."""
    return section_defaults(section, load_schema())
