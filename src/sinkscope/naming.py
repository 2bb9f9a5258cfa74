"""How things are named: paper labels, layer groups, per-layer files, stable hashes.

A leaf module (no torch, no pandas): the planning code, the jobs and the figures all
name layers, heads and files through it, so a name is defined once. Data stays 0-based;
labels follow the paper (L1H1 = layer 0, head 0).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError

HEAD_LABEL = re.compile(r"^L(\d+)H(\d+)$")


def parse_head_label(label: str) -> tuple[int, int]:
    """'L5H10' (paper notation, 1-based) -> (layer 4, head 9), 0-based."""
    match = HEAD_LABEL.match(label)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ConfigError(
            f"config key figures.heads: {label!r} is not a head like 'L1H1': heads are 1-based (L1H1 = layer 0, head 0)"
        )
    return int(match.group(1)) - 1, int(match.group(2)) - 1


def head_label(layer: int, head: int) -> str:
    """(layer 4, head 9) -> 'L5H10', the paper's 1-based notation."""
    return f"L{layer + 1}H{head + 1}"


def layer_label(layer: int) -> str:
    """Layer 4 -> 'L5'."""
    return f"L{layer + 1}"


def stable_hash(data: Any) -> str:
    """Short sha256 of a JSON-serializable value (sorted keys): the config hash."""
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# A layer group's name ('0-2_5_7-8'), as a regex: the Snakefile's wildcard constraint and
# the checks of extraction folders use it.
LAYER_GROUP = r"\d+(?:-\d+)?(?:_\d+(?:-\d+)?)*"
# The file of each kind a layer has inside an extraction folder.
_LAYER_SUFFIXES = {"frames": "", "queries": ".queries", "tokens": ".tokens"}


def encode_layers(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2_5_7-8': a compact, path-safe name for a layer group."""
    layers = sorted(layers)
    parts, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            parts.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return "_".join(parts)


def decode_layers(name: str) -> list[int]:
    """'0-2_5_7-8' -> [0, 1, 2, 5, 7, 8] (the inverse of ``encode_layers``)."""
    layers: list[int] = []
    for part in name.split("_"):
        first, _, last = part.partition("-")
        layers.extend(range(int(first), int(last or first) + 1))
    return layers


def layer_file(directory: str | Path, layer: int | str, kind: str = "frames") -> str:
    """A layer's file inside an extraction folder: frames, queries or tokens."""
    return f"{directory}/layer{layer}{_LAYER_SUFFIXES[kind]}.parquet"


def is_group_folder(name: str) -> bool:
    """Whether ``name`` is an extraction folder's name (``layers<group>``)."""
    return re.fullmatch(f"layers{LAYER_GROUP}", name) is not None


def is_layer_file(name: str) -> bool:
    """Whether ``name`` is a layer's file inside an extraction folder."""
    suffixes = "|".join(re.escape(suffix) for suffix in _LAYER_SUFFIXES.values() if suffix)
    return re.fullmatch(rf"layer\d+(?:{suffixes})?\.parquet", name) is not None
