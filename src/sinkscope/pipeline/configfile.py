"""Reading a config file: YAML's safe loader, refusing what YAML accepts silently (a key
given twice, an empty file), every error naming the file. Torch-free (the Snakefile reads
configs through it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sinkscope.errors import ConfigError


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader, refusing a key given twice in one mapping (YAML keeps the last)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise ConfigError(
                f"key {key!r} is given twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); YAML would "
                "silently keep the last"
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_config_file(path: str | Path) -> dict:
    """A config file's mapping, refusing what YAML would accept silently (a key twice, an
    empty file) and naming the file in every error."""
    path = Path(path)
    where = f"config file {str(path)!r}"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a folder, not a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not a text file") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(exc).split())}") from None
    if raw is None:
        raise ConfigError(f"{where} is empty; it must hold a mapping of config keys (see config.yaml)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must hold a mapping of config keys, not a {type(raw).__name__}")
    return raw
