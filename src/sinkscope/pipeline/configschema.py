"""The config against its JSON schema (src/sinkscope/schemas/config.schema.yaml):
values coerced to the schema's types (Snakemake's ``--config`` gives strings), defaults
filled, every violation described in one line naming the key and the value, and NaN or
infinity, which pass every JSON-schema bound, found apart."""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

from sinkscope.names import name_problem, variant_name_problem
from sinkscope.schema import load_schema, resolve_ref

# -- coercion ------------------------------------------------------------------------

_INT = re.compile(r"^[+-]?\d+$")
_TRUE, _FALSE, _NULL = {"true", "yes", "on"}, {"false", "no", "off"}, {"null", "none", "~"}


def _types(schema: Mapping) -> list[str]:
    declared = schema.get("type")
    if declared is None:
        return []
    return [declared] if isinstance(declared, str) else list(declared)


def _coerce_scalar(value: Any, types: list[str]) -> Any:
    if not isinstance(value, str):
        if isinstance(value, float) and "integer" in types and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and "number" in types and "integer" not in types:
            return float(value)  # canonical: timestep_shift 5 and 5.0 are one param
        return value
    text = value.strip()
    lowered = text.lower()
    if "null" in types and lowered in _NULL:
        return None
    if "integer" in types and _INT.match(text):
        return int(text)
    if "number" in types:
        try:
            return float(text)
        except ValueError:
            pass
    if "integer" in types:
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            if number.is_integer():
                return int(number)
    if "boolean" in types and lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    return value


def coerce(value: Any, schema: Mapping) -> Any:
    """Convert strings (and scalars given for lists) to the types ``schema`` asks for."""
    schema = resolve_ref(schema)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            for option in schema[key]:
                converted = coerce(value, option)
                if converted is not value and converted != value:
                    return converted
            return value
    types = _types(schema)
    if "array" in types:
        if value is not None and not isinstance(value, (list, tuple)) and "items" in schema:
            if not (isinstance(value, str) and "string" in types):
                value = [value]
        if isinstance(value, (list, tuple)):
            return [coerce(item, schema.get("items", {})) for item in value]
    if "object" in types and isinstance(value, Mapping):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        result = {}
        for key, item in value.items():
            if key in properties:
                result[key] = coerce(item, properties[key])
            elif isinstance(extra, Mapping):
                result[key] = coerce(item, extra)
            else:
                result[key] = item
        return result
    if "enum" in schema and isinstance(value, str) and value not in schema["enum"]:
        for option in schema["enum"]:
            if not isinstance(option, str) and str(option).lower() == value.strip().lower():
                return option
    return _coerce_scalar(value, types)


# -- defaults ------------------------------------------------------------------------


def fill_defaults(value: Any, schema: Mapping) -> Any:
    """Fill ``default:`` values of the schema, recursively (nested objects included).

    A section marked ``x-inherits`` (variants) is left as given: its missing keys are
    inherited from another section, not defaulted."""
    schema = resolve_ref(schema)
    if not isinstance(value, dict) or schema.get("x-inherits"):
        return value
    properties = schema.get("properties", {})
    for key, sub in properties.items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value:
            value[key] = fill_defaults(value[key], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        for key in value:
            if key not in properties:
                value[key] = fill_defaults(value[key], extra)
    return value


# -- validation ----------------------------------------------------------------------


def _key_path(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<config>"


def _describe(error) -> str:
    key = _key_path(error.absolute_path)
    value = error.instance
    if "propertyNames" in error.schema_path:
        problem = variant_name_problem(value) if key == "variants" else name_problem(value)
        return f"config key {key}: {problem}"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed)) if isinstance(value, dict) else []
        where = f" in {key}" if error.absolute_path else ""
        hint = f"; known keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown config key {', '.join(map(repr, extra))}{where}{_guesses(extra, allowed)}{hint}"
    if error.validator == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        return f"config key {key}: {value!r} is not {_article(wanted)}"
    if error.validator == "enum":
        guess = _guesses([value], [str(option) for option in error.validator_value]) if isinstance(value, str) else ""
        return f"config key {key}: {value!r} is not one of {', '.join(map(repr, error.validator_value))}{guess}"
    if error.validator == "anyOf":
        options = []
        for option in error.validator_value:
            least = f" of at least {option['minimum']}" if "minimum" in option else ""
            options += [repr(v) for v in option.get("enum", [])] or [_article(option.get("type", "value")) + least]
        return f"config key {key}: {value!r} is not {' or '.join(options)}"
    if error.validator == "pattern" and list(error.absolute_path)[:2] == ["figures", "heads"]:
        return f"config key {key}: {value!r} is not a head like 'L1H1': heads are 1-based (L1H1 = layer 0, head 0)"
    if error.validator == "pattern":
        return f"config key {key}: {value!r} does not match the pattern {error.validator_value}"
    if error.validator in (
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minItems",
        "uniqueItems",
        "minProperties",
        "minLength",
        "maxLength",
    ):
        return f"config key {key}: {error.message}"
    return f"config key {key}: {value!r}: {error.message}"


def _guesses(unknown: list[str], known: list[str]) -> str:
    """' (did you mean 'num_frames'?)': the known keys the unknown ones most resemble."""
    found = {name: difflib.get_close_matches(str(name), known, n=1, cutoff=0.6) for name in unknown}
    found = {name: close[0] for name, close in found.items() if close}
    if not found:
        return ""
    if len(unknown) == 1:
        return f" (did you mean {next(iter(found.values()))!r}?)"
    return f" (did you mean {', '.join(f'{close!r} for {name!r}' for name, close in found.items())}?)"


def _article(type_name: str) -> str:
    return {"integer": "an integer", "array": "a list", "object": "a mapping"}.get(type_name, f"a {type_name}")


def schema_problems(config: Mapping) -> list[tuple[str, str]]:
    """Every schema violation as (the top-level section it lies in, one line naming key
    and value); the section is '' for an unknown top-level key (which leaves the others
    whole)."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema())
    errors = sorted(
        validator.iter_errors(config), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path)))
    )
    return [(_section_of(error), _describe(error)) for error in errors]


def _section_of(error) -> str:
    """The top-level section a schema error leaves unusable; '' for one that leaves every
    section whole: an unknown top-level key, a name the name rule refuses too (the entry
    under it is checked as usual)."""
    if not error.absolute_path or "propertyNames" in error.schema_path:
        return ""
    return str(error.absolute_path[0])


def finite_problems(value: Any, key: str = "") -> list[tuple[str, str]]:
    """NaN and infinity pass every JSON-schema bound (comparisons with NaN are false): each
    one, as (section, line)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [(key.split(".")[0].split("[")[0], f"config key {key or '<config>'}: {value!r} is not a finite number")]
    found = []
    if isinstance(value, Mapping):
        for name, item in value.items():
            found += finite_problems(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += finite_problems(item, f"{key}[{index}]")
    return found
