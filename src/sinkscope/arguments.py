"""Command-line arguments checked before any work: a bad one is one line naming it.

``OneLineArgumentParser`` reports an argument error as one line (no usage dump); the
types below refuse a value with a reason argparse puts after the argument's name.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported as one line that names it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def natural(text: str) -> int:
    """A whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def positive(text: str) -> int:
    """A whole number >= 1."""
    value = natural(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not positive")
    return value


def fraction(text: str) -> float:
    """A finite number in [0, 1]."""
    value = _finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g} is not between 0 and 1")
    return value


def torch_device(text: str) -> str:
    """cpu, cuda or cuda:N (checked by name; whether it exists is the job's check)."""
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind != "cuda" or not index.isdigit())):
        raise argparse.ArgumentTypeError(f"{text!r} is not cpu, cuda or cuda:N")
    return text
