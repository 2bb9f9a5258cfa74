"""Results that cannot silently go wrong: content digests, manifests and the pre-run scan.

Three layers, each cheap where it runs often:

- every Parquet file the pipeline writes carries page checksums (verified by every
  read) and, in its metadata, a sha256 of every column's content (verified by every
  full read): a flipped byte fails the read, naming the file;
- every extraction job writes a ``manifest.json`` last, listing its files with size,
  mtime and sha256 and what they hold (layers, calls, rows); a job's folder without a
  manifest is incomplete;
- before any job runs, the Snakefile compares each existing extraction folder with
  its manifest (stat calls; a file re-hashed only when its mtime changed). A missing,
  damaged or unlisted file stops the run before anything downstream is replaced, and
  the message names the file and the command that rebuilds it. Snakemake cannot see
  inside ``directory()`` outputs itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sinkscope.errors import DamagedFileError
from sinkscope.manifests import (
    DATASET_MANIFEST,
    MANIFEST,
    check_directory,
    file_sha256,
)
from sinkscope.naming import is_group_folder, is_layer_file

# How far a query frame's prob_mass (or argmax_share) may sum from 1.
PROB_TOLERANCE = 1e-3


# -- contents


def check_layer_rows(frames, *, layer: int, calls: int, heads: int, where: str) -> None:
    """Fail unless one layer's frame rows are what a generation must produce.

    Every call present, every (call, head, query frame) with key frames whose
    prob_mass and argmax_share sum to 1, finite statistics. A statistic a study left out
    (``capture.statistics``) is NaN in every row, and then not checked.
    """
    import numpy as np

    if frames.empty:
        raise DamagedFileError(where, f"holds no rows of layer {layer}")
    found_calls = frames.groupby(["block", "pass", "step"], observed=True).ngroups
    if found_calls != calls:
        raise DamagedFileError(where, f"holds {found_calls} calls of layer {layer}, the generation makes {calls}")
    found_heads = frames["head"].nunique()
    if found_heads != heads:
        raise DamagedFileError(where, f"holds {found_heads} heads of layer {layer}, the model has {heads}")
    taken = [name for name in ("logit_mean", "prob_mass", "argmax_share") if not frames[name].isna().all()]
    if not np.isfinite(frames[taken].to_numpy()).all():
        raise DamagedFileError(where, f"holds non-finite statistics in layer {layer}")
    summed = [name for name in ("prob_mass", "argmax_share") if name in taken]
    if not summed:
        return
    sums = frames.groupby(["block", "pass", "step", "head", "query_frame"], observed=True)[summed].sum()
    worst = float((sums - 1).abs().max().max())
    if not worst <= PROB_TOLERANCE:
        raise DamagedFileError(
            where, f"layer {layer}: prob_mass or argmax_share of a query frame sums to 1 {worst:+.3g}"
        )


# -- extraction manifests ------------------------------------------------------------------


# Parquet files up to this size are read in full by every pre-run scan (page checksums
# and column digests: a flipped byte anywhere is seen); larger ones by their footer, and
# in full by `sinkscope verify`.
FULL_SCAN_BYTES = 64 * 2**20

# The files whose content check_result checks; any other file only by being non-empty.
CHECKED_SUFFIXES = (".parquet", ".png", ".svg", ".html", ".csv", ".safetensors")


def is_checked_file(path: str | Path) -> bool:
    """Whether ``check_result`` checks this file's content (by its kind)."""
    return Path(path).suffix in CHECKED_SUFFIXES


def check_result(path: str | Path, *, full: bool = False) -> list[str]:
    """Problems of one result the pipeline owns ([] when it is whole): a folder against
    its manifest, a Parquet file by its checksums and digests (its footer only, past
    ``FULL_SCAN_BYTES``, unless ``full``), a PNG by its chunks' CRCs, an SVG or HTML page
    by its closing tag, a CSV table by its rows' widths, a prompt embedding by the
    digest written with it, any other file by being non-empty."""
    path = Path(path)
    if path.is_dir():
        for name in (MANIFEST, DATASET_MANIFEST):
            if (path / name).is_file():
                return check_directory(path, full=full, name=name)
        return [f"{path}: incomplete: it has no manifest (the job that wrote it did not finish)"]
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return []
    if size == 0:
        return [f"{path}: empty (its job did not finish writing it)"]
    try:
        if path.suffix == ".parquet":
            from sinkscope.tables import check_footer, read_arrow

            if full or size <= FULL_SCAN_BYTES:
                read_arrow(path)
            else:
                check_footer(path)
        elif path.suffix == ".png":
            _check_png(path)
        elif path.suffix in (".svg", ".html"):
            closing = b"</svg>" if path.suffix == ".svg" else b"</html>"
            with open(path, "rb") as handle:
                handle.seek(max(0, size - 256))
                if closing not in handle.read():
                    raise DamagedFileError(path, f"is cut short (no closing {closing.decode()})")
        elif path.suffix == ".csv":
            _check_csv(path)
        elif path.suffix == ".safetensors" and (path.parent / MANIFEST).is_file():
            # A file of an extraction folder (a run's latents): against the folder's manifest.
            return [problem for problem in check_directory(path.parent, full=full) if path.name in problem]
        elif path.suffix == ".safetensors":
            _check_embedding(path)
    except DamagedFileError as exc:
        return [str(exc)]
    return []


def _check_png(path: Path) -> None:
    """Every chunk's CRC, up to IEND (a PNG is a few hundred kB: read whole)."""
    import zlib

    data = path.read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DamagedFileError(path, "is not a PNG image (its signature is damaged)")
    offset = 8
    while offset + 12 <= len(data):
        length = int.from_bytes(data[offset : offset + 4], "big")
        kind = data[offset + 4 : offset + 8]
        end = offset + 12 + length
        if end > len(data):
            break
        if zlib.crc32(data[offset + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
            raise DamagedFileError(path, f"is damaged (its {kind.decode('latin-1')} chunk fails its CRC)")
        if kind == b"IEND":
            return
        offset = end
    raise DamagedFileError(path, "is cut short (no IEND chunk)")


def _check_csv(path: Path) -> None:
    """UTF-8 text that ends its last line, every row as wide as the header (a table the
    pipeline writes is small: read whole)."""
    import csv
    import io

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DamagedFileError(path, "is not a CSV table (not UTF-8 text)") from None
    if not text.endswith("\n"):
        raise DamagedFileError(path, "is cut short (its last line has no end)")
    rows = list(csv.reader(io.StringIO(text)))
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        line = next(i for i, row in enumerate(rows, 1) if len(row) != len(rows[0]))
        raise DamagedFileError(
            path, f"is damaged (row {line} has {len(rows[line - 1])} fields, the header {len(rows[0])})"
        )


def _check_embedding(path: Path) -> None:
    """A prompt embedding (safetensors, one float32 tensor ``context``): its header, its
    size, and its bytes against the ``context_sha256`` written with them."""
    import hashlib
    import json
    import struct

    data = path.read_bytes()
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        start, end = header["context"]["data_offsets"]
    except (struct.error, ValueError, TypeError, KeyError):
        raise DamagedFileError(path, "is not a prompt embedding (its safetensors header is damaged)") from None
    body = data[8 + length :]
    if len(body) != end or start != 0:
        raise DamagedFileError(path, f"is damaged (it holds {len(body)} bytes of data, its header says {end})")
    expected = (header.get("__metadata__") or {}).get("context_sha256")
    if expected is not None and hashlib.sha256(body).hexdigest() != expected:
        raise DamagedFileError(path, "is damaged (its bytes do not match the digest written with them)")


def scan_results(paths: Iterable[str | Path]) -> dict[str, list[str]]:
    """{result: problems} for the existing results among ``paths`` that are not whole;
    results that do not exist are Snakemake's business (it will run their jobs)."""
    damaged = {}
    for path in paths:
        problems = check_result(path)
        if problems:
            damaged[str(path)] = problems
    return damaged


def verify_file(path: str | Path, manifest: Mapping[str, Any] | None) -> None:
    """Fail unless ``path`` matches its manifest record (size and sha256)."""
    path = Path(path)
    if manifest is None:
        return
    record = manifest["files"].get(path.name)
    if record is None:
        raise DamagedFileError(path, "is not listed in its folder's manifest.json")
    if path.stat().st_size != record["size"] or file_sha256(path) != record["sha256"]:
        raise DamagedFileError(path, "is damaged (it differs from what its extraction job wrote)")


_MOVED_ASIDE = re.compile(r"\.damaged(-\d+)?$")


def is_moved_aside(path: str | Path) -> bool:
    """Whether ``path`` is a result moved aside as damaged (``<name>.damaged[-N]``)."""
    return _MOVED_ASIDE.search(Path(path).name) is not None


def quarantine(path: str | Path) -> Path | None:
    """Move a damaged result aside (``<name>.damaged``), so Snakemake sees it missing and
    rebuilds it on the next run; kept, not deleted, for a look at what went wrong.

    A file inside an extraction folder takes the whole folder with it (the folder is
    the job's output). Returns the new path, or None when there is nothing to move.
    """
    path = Path(path)
    in_extraction = is_layer_file(path.name) and is_group_folder(path.parent.name)
    if path.name in (MANIFEST, DATASET_MANIFEST) or in_extraction:
        path = path.parent
    if not path.exists():
        return None
    target = path.with_name(path.name + ".damaged")
    number = 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}.damaged-{number}")
    os.replace(path, target)
    return target
