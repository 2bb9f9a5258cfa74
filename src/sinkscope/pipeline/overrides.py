"""Config overrides from the command line, read as ``snakemake --config`` reads them.

``sinkscope check config.yaml KEY=VALUE ...`` and ``snakemake --config KEY=VALUE ...``
must build the same config from the same words, so the values are parsed the way
Snakemake's own command line parses them (strings inside lists and mappings, coerced
later against the schema) and merged the way it merges them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from sinkscope.errors import ConfigError

__all__ = ["apply_overrides", "parse_config_overrides"]


def apply_overrides(raw: dict, overrides: Mapping | None) -> dict:
    """Set overrides on a raw config as Snakemake's ``--config`` does: a mapping value is
    merged into the mapping it names (``generation={num_frames: 9}`` keeps the other
    ``generation`` keys), anything else replaces the value. Dotted keys (Python callers
    only; Snakemake refuses them) set one nested key (``generation.local_attn_frames``)."""
    for key, value in (overrides or {}).items():
        target = raw
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[leaf] = _merged(target.get(leaf), value)
    return raw


def _merged(old: Any, new: Any) -> Any:
    if not isinstance(new, Mapping):
        return new
    result = dict(old) if isinstance(old, Mapping) else {}
    for key, value in new.items():
        result[key] = _merged(result.get(key), value)
    return result


# Snakemake's --config accepts only these keys: no dots, at least two characters.
_OVERRIDE_KEY = re.compile(r"[a-zA-Z_][\w-]*\w$")
# A part of a dotted key (extract --set): a config key, or a name the user chose (a
# checkpoint 'a', a prompt '7'); a name with a dot is set through the nested form.
_DOTTED_PART = re.compile(r"[A-Za-z0-9_][\w+-]*$")


def parse_config_overrides(pairs: list[str], *, dotted: bool = False) -> dict:
    """``key=value`` pairs read exactly as ``snakemake --config`` reads them: the value an
    int, a float, True/False, else YAML with every scalar a string (``[0, 1]`` gives
    ``['0', '1']``, coerced later), else the text; a mapping is a nested override
    (``generation={num_frames: 9}``). A key Snakemake refuses (a dotted one among them)
    is refused here too, naming the form it takes; ``dotted`` (``sinkscope extract
    --set``) also takes ``generation.num_frames=9``."""
    result: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ConfigError(f"override {pair!r} is not key=value")
        parts = key.split(".")
        if dotted and len(parts) > 1:
            if not all(_DOTTED_PART.match(part) for part in parts):
                raise ConfigError(
                    f"override {pair!r}: {key!r} is not a dotted key (config keys and names joined by '.', each of "
                    "letters, digits, _ + and -; a name with a '.' is set in the nested form: "
                    f"{parts[0]}='{{...}}')"
                )
            result[key] = _override_value(text)
            continue
        if not _OVERRIDE_KEY.match(key):
            if "." in key and _OVERRIDE_KEY.match(parts[0]) and all(_DOTTED_PART.match(part) for part in parts):
                nested = text
                for part in reversed(key.split(".")[1:]):
                    nested = f"{{{part}: {nested}}}"
                raise ConfigError(
                    f"override {pair!r}: snakemake --config takes no dotted keys; write "
                    f"{key.split('.')[0]}={nested!r} (YAML for the nested key)"
                )
            raise ConfigError(
                f"override {pair!r}: {key!r} is not a key snakemake --config accepts (letters, digits, _ "
                "and -, starting with a letter or _, two characters or more)"
            )
        value = _override_value(text)
        result[key] = _merged(result.get(key), value)
    return result


def _override_value(text: str) -> Any:
    if text == "":
        return None
    for parse in (int, float, _python_bool):
        try:
            return parse(text)
        except ValueError:
            pass
    try:
        return yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError:
        return text


def _python_bool(text: str) -> bool:
    if text in ("True", "False"):
        return text == "True"
    raise ValueError(text)
