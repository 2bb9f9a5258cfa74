"""Paper notation for layers, heads and frames (data stays 0-based)."""

from __future__ import annotations

import re

from .errors import ConfigError

HEAD_LABEL = re.compile(r"^L(\d+)H(\d+)$")


def parse_head_label(label: str) -> tuple[int, int]:
    """'L5H10' (paper notation, 1-based) -> (layer 4, head 9), 0-based."""
    match = HEAD_LABEL.match(label)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ConfigError(f"config key figures.heads: {label!r} is not a head like 'L1H1' (1-based layer and head)")
    return int(match.group(1)) - 1, int(match.group(2)) - 1


def head_label(layer: int, head: int) -> str:
    """(layer 4, head 9) -> 'L5H10', the paper's 1-based notation."""
    return f"L{layer + 1}H{head + 1}"


def layer_label(layer: int) -> str:
    """Layer 4 -> 'L5'."""
    return f"L{layer + 1}"
