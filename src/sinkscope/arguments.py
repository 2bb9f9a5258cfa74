"""Command-line arguments checked before any work: a bad one is one line naming it.

``OneLineArgumentParser`` reports an argument error as one line (no usage dump); the
types below refuse a value with a reason argparse puts after the argument's name.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import NoReturn

from sinkscope.errors import ConfigError
from sinkscope.schema import load_schema

# What every --out and --out-prefix accepts, for their --help.
OUTPUT_RULE = "the folder it goes in must exist, or be the only missing one (then it is created)"


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


def name(text: str) -> str:
    """A name that becomes file and folder names (``names.name_problem``, the config's rule)."""
    from sinkscope.names import name_problem

    problem = name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def source_name(text: str) -> str:
    """A source's name: a name, or ``<checkpoint>@<variant>`` (two names)."""
    for part in text.split("@", 1) if text.count("@") == 1 else [text]:
        name(part)
    return text


def output_path(text: str) -> str:
    """A path to write (a file, a folder or a figure prefix): the folder it goes in exists
    and takes new files, or only that last folder is missing and the one above it takes
    new files. So ``results/new/x.parquet`` works where ``results/`` exists, and a typo
    in a path's start (``/nonexistent/dir/x.parquet``) is refused before any work."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    folder = Path(text).parent
    if not folder.exists():
        above = folder.parent
        if not above.exists():
            raise argparse.ArgumentTypeError(
                f"{text!r}: folder {str(above)!r} does not exist (only the last folder of an output path is created)"
            )
        folder = above
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {str(folder)!r} is a file, not a folder")
    if not _takes_new_files(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {str(folder)!r} is not writable")
    return text


def output_folder(text: str) -> str:
    """A folder to write into: as ``output_path``, and not an existing file."""
    if Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is an existing file, not a folder")
    return output_path(text)


def torch_checkpoint(text: str) -> str:
    """An existing ``.pt`` file (what torch.save and train-demo write)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    if not path.is_file() or path.suffix != ".pt":
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a .pt checkpoint (train-demo writes final.pt and checkpoints/*.pt)"
        )
    return text


def _takes_new_files(folder: Path) -> bool:
    """Whether a file can be created in ``folder``. Permission bits say nothing for root
    (nor for /proc or a read-only mount), so a file is made and removed at once."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".sinkscope-write-test-"):
            return True
    except OSError:
        return False


def call_step(text: str) -> str | int:
    """argparse type: last, cache, or a denoising step index."""
    return text if text in ("last", "cache") else natural(text)


def dpi(text: str) -> int:
    """argparse type: a PNG resolution within the schema's bounds."""
    bounds = load_schema()["properties"]["figures"]["properties"]["dpi"]
    value = natural(text)
    if not bounds["minimum"] <= value <= bounds["maximum"]:
        raise argparse.ArgumentTypeError(f"{value} is outside {bounds['minimum']}..{bounds['maximum']}")
    return value


def paper_head(text: str) -> str:
    """argparse type: a head in the paper's notation (checked, returned as given)."""
    from sinkscope.naming import parse_head_label

    try:
        parse_head_label(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a head like L1H1 (1-based layer and head)") from None
    return text
