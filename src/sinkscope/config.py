"""The pipeline config: coercion, defaults, JSON-schema validation and semantic checks.

Every error names the config key and the offending value, so a bad config is
rejected before any job runs. Snakemake's ``--config 'layers=[0,1,2]'`` delivers list
items (and nested values) as strings; values are coerced to the schema's types first,
and rejected only when they cannot be.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import yaml

SCHEMA_PATH = Path(__file__).with_name("schemas") / "config.schema.yaml"
HEAD_LABEL = re.compile(r"^L(\d+)H(\d+)$")


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and the value."""


@lru_cache(maxsize=1)
def load_schema() -> dict:
    with open(SCHEMA_PATH) as handle:
        return yaml.safe_load(handle)


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
    if "boolean" in types and lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    return value


def coerce(value: Any, schema: Mapping) -> Any:
    """Convert strings (and scalars given for lists) to the types ``schema`` asks for."""
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
    """Fill ``default:`` values of the schema, recursively (nested objects included)."""
    if not isinstance(value, dict):
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
        return f"config key {key}: name {value!r} is not allowed (use letters, digits and _ . + - only)"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(value) - set(allowed)) if isinstance(value, dict) else []
        where = f" in {key}" if error.absolute_path else ""
        hint = f"; known keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown config key {', '.join(map(repr, extra))}{where}{hint}"
    if error.validator == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        return f"config key {key}: {value!r} is not {_article(wanted)}"
    if error.validator == "enum":
        return f"config key {key}: {value!r} is not one of {', '.join(map(repr, error.validator_value))}"
    if error.validator == "anyOf":
        options = []
        for option in error.validator_value:
            options += [repr(v) for v in option.get("enum", [])] or [_article(option.get("type", "value"))]
        return f"config key {key}: {value!r} is not {' or '.join(options)}"
    if error.validator == "pattern":
        return f"config key {key}: {value!r} does not match the pattern {error.validator_value}"
    return f"config key {key}: {value!r}: {error.message}"


def _article(type_name: str) -> str:
    return {"integer": "an integer", "array": "a list", "object": "a mapping"}.get(type_name, f"a {type_name}")


def validate_schema(config: Mapping) -> None:
    """Raise ConfigError listing every schema violation, key and value named."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        lines = sorted({_describe(error) for error in errors})
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines))


def parse_head_label(label: str) -> tuple[int, int]:
    """'L5H10' (paper notation, 1-based) -> (layer 4, head 9), 0-based."""
    match = HEAD_LABEL.match(label)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ConfigError(f"config key figures.heads: {label!r} is not a head like 'L1H1' (1-based layer and head)")
    return int(match.group(1)) - 1, int(match.group(2)) - 1


def head_label(layer: int, head: int) -> str:
    """(layer 4, head 9) -> 'L5H10', the paper's 1-based notation."""
    return f"L{layer + 1}H{head + 1}"


# -- resolved pieces -----------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointSpec:
    """One ``checkpoints:`` entry, resolved."""

    name: str
    model: str | None
    format: str
    weights: str | None
    base: str | None
    seed: int
    ema: bool
    allow_pickle: bool
    dtype: str

    @classmethod
    def from_config(cls, name: str, entry: Mapping[str, Any]) -> "CheckpointSpec":
        fields = {key: entry.get(key) for key in ("model", "format", "weights", "base", "seed", "ema", "allow_pickle", "dtype")}
        return cls(name=name, **fields)

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}

    @property
    def is_demo(self) -> bool:
        return self.format == "demo"


def checkpoint_specs(config: Mapping) -> dict[str, CheckpointSpec]:
    return {name: CheckpointSpec.from_config(name, entry) for name, entry in config["checkpoints"].items()}


def stable_hash(data: Any) -> str:
    """Short sha256 of a JSON-serializable value (sorted keys): the config hash."""
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# -- semantic checks -----------------------------------------------------------------


def _check_semantics(config: dict, base_dir: Path) -> None:
    from .generation import GenerationOptions
    from .model.loading import resolve_model_config

    problems: list[str] = []
    try:
        GenerationOptions.from_dict(config["generation"])
    except ValueError as exc:
        problems.append(str(exc))

    heads = []
    for label in config["figures"]["heads"]:
        try:
            heads.append((label, *parse_head_label(label)))
        except ConfigError as exc:
            problems.append(str(exc))

    for name, spec in checkpoint_specs(config).items():
        try:
            model_config = resolve_model_config(spec, base_dir=base_dir)
        except (ValueError, KeyError, FileNotFoundError) as exc:
            problems.append(f"config key checkpoints.{name}: {exc}")
            continue
        generation = config["generation"]
        try:
            model_config.frame_seq_length(generation["latent_height"], generation["latent_width"])
        except ValueError as exc:
            problems.append(f"config key generation.latent_height/latent_width: {exc}")
        bad_layers = [layer for layer in config["layers"] if layer >= model_config.num_layers]
        if bad_layers:
            problems.append(
                f"config key layers: {bad_layers} do not exist in checkpoint {name!r} "
                f"(model has layers 0..{model_config.num_layers - 1})"
            )
        for label, layer, head in heads:
            if layer >= model_config.num_layers or head >= model_config.num_heads:
                problems.append(
                    f"config key figures.heads: {label!r} does not exist in checkpoint {name!r} "
                    f"({model_config.num_layers} layers x {model_config.num_heads} heads)"
                )
    step = config["figures"]["step"]
    steps = len(config["generation"]["denoising_steps"])
    if isinstance(step, int) and step >= steps:
        problems.append(f"config key figures.step: {step} is past the last denoising step {steps - 1}")
    for name, entry in config["legacy_caches"].items():
        path = Path(entry["path"])
        if not (path if path.is_absolute() else base_dir / path).is_file():
            problems.append(f"config key legacy_caches.{name}.path: file {entry['path']!r} does not exist")
        if name in config["checkpoints"]:
            problems.append(f"config key legacy_caches.{name}: the name is also a checkpoint; names must differ")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def normalize_config(raw: Mapping | None, base_dir: str | Path = ".") -> dict:
    """Coerce, fill defaults, validate; return the config every rule reads.

    ``base_dir`` resolves relative paths (the workflow's working directory).
    Raises ConfigError naming every problem found.
    """
    schema = load_schema()
    config = coerce(copy.deepcopy(dict(raw or {})), schema)
    config = fill_defaults(config, schema)
    validate_schema(config)
    _check_semantics(config, Path(base_dir))
    return config


def load_config(path: str | Path, overrides: Mapping | None = None, base_dir: str | Path = ".") -> dict:
    """Read a YAML config file (plus overrides) and normalize it; paths resolve from base_dir."""
    path = Path(path)
    try:
        with open(path) as handle:
            raw = yaml.safe_load(handle) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys")
    raw.update(overrides or {})
    return normalize_config(raw, base_dir=base_dir)
