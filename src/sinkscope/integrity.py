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

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .errors import DamagedFileError
from .io import atomic_path

MANIFEST = "manifest.json"
# Parquet dataset folders (token profiles) list their files in "_manifest.json": dataset
# readers skip names starting with "_", so the folder stays a plain Parquet dataset.
DATASET_MANIFEST = "_manifest.json"
# How far a query frame's prob_mass (or argmax_share) may sum from 1.
PROB_TOLERANCE = 1e-3


def layer_file(directory: str | Path, layer: int | str, kind: str = "frames") -> str:
    """A layer's file inside an extraction folder: frames, queries or tokens."""
    suffix = {"frames": "", "queries": ".queries", "tokens": ".tokens"}[kind]
    return f"{directory}/layer{layer}{suffix}.parquet"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def column_digests(table) -> dict[str, str]:
    """sha256 of each column's values (pyarrow Table), independent of chunking and of
    how the file stores them, so a writer and a reader compute the same digest."""
    import numpy as np
    import pyarrow as pa

    digests = {}
    for name in table.column_names:
        column = table.column(name)
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        digest = hashlib.sha256(str(array.type).encode())
        digest.update(len(array).to_bytes(8, "little"))
        if array.null_count:
            digest.update(np.asarray(array.is_null()).tobytes())
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type) or pa.types.is_binary(array.type):
            array = array.cast(pa.large_binary())
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + len(array) + 1]
            data = array.buffers()[2]
            digest.update((offsets - offsets[0]).tobytes())
            if data is not None:
                digest.update(memoryview(data)[offsets[0] : offsets[-1]])
        elif not array.null_count and array.type.bit_width % 8 == 0 and not pa.types.is_boolean(array.type):
            width = array.type.bit_width // 8  # the values buffer itself, no copy
            digest.update(memoryview(array.buffers()[1])[array.offset * width : (array.offset + len(array)) * width])
        else:
            digest.update(np.ascontiguousarray(array.fill_null(0).to_numpy(zero_copy_only=False)).tobytes())
        digests[name] = digest.hexdigest()
    return digests


# -- contents


def check_layer_rows(frames, *, layer: int, calls: int, heads: int, where: str) -> None:
    """Fail unless one layer's frame rows are what a generation must produce.

    Every call present, every (call, head, query frame) with key frames whose
    prob_mass and argmax_share sum to 1, finite statistics.
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
    if not np.isfinite(frames[["logit_mean", "prob_mass"]].to_numpy()).all():
        raise DamagedFileError(where, f"holds non-finite statistics in layer {layer}")
    sums = frames.groupby(["block", "pass", "step", "head", "query_frame"], observed=True)[["prob_mass", "argmax_share"]].sum()
    worst = float((sums - 1).abs().max().max())
    if not worst <= PROB_TOLERANCE:
        raise DamagedFileError(where, f"layer {layer}: prob_mass or argmax_share of a query frame sums to 1 {worst:+.3g}")



# -- extraction manifests ------------------------------------------------------------------


def file_record(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(path)}


def write_manifest(directory: str | Path, files: Iterable[str], contents: Mapping[str, Any], name: str = MANIFEST) -> None:
    """Record ``files`` (paths relative to ``directory``) and what they hold; written last."""
    directory = Path(directory)
    manifest = {
        "files": {name: file_record(directory / name) for name in sorted(files)},
        "contents": dict(contents),
    }
    with atomic_path(directory / name) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def read_manifest(directory: str | Path, name: str = MANIFEST) -> dict[str, Any]:
    path = Path(directory) / name
    if not path.is_file():
        raise DamagedFileError(directory, f"incomplete: it has no {name} (the job that wrote it did not finish)")
    try:
        manifest = json.loads(path.read_text())
        manifest["files"], manifest["contents"]  # noqa: B018 - both must exist
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise DamagedFileError(path, "is damaged (not the JSON manifest sinkscope writes)") from None
    return manifest


def check_directory(directory: str | Path, *, full: bool = False, name: str = MANIFEST) -> list[str]:
    """Problems of one extraction folder against its manifest ([] when it is whole).

    By default only sizes and mtimes are compared, and a file is hashed only when its
    mtime changed (a touch is not damage); ``full`` hashes every file.
    """
    directory = Path(directory)
    try:
        manifest = read_manifest(directory, name)
    except DamagedFileError as exc:
        return [str(exc)]
    problems = []
    for listed_name, record in manifest["files"].items():
        path = directory / listed_name
        try:
            stat = path.stat()
        except FileNotFoundError:
            problems.append(f"{path}: missing (its extraction job wrote it)")
            continue
        if stat.st_size != record["size"]:
            problems.append(f"{path}: damaged (size {stat.st_size} bytes, written as {record['size']})")
        elif (full or stat.st_mtime_ns != record["mtime_ns"]) and file_sha256(path) != record["sha256"]:
            problems.append(f"{path}: damaged (its content changed after it was written)")
    listed = set(manifest["files"]) | {name}
    present = (p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    extra = sorted(p for p in present if p not in listed and not any(part.startswith(".") for part in p.split("/")))
    if extra:
        problems.append(f"{directory}: holds files its job did not write ({', '.join(extra[:3])})")
    return problems


def check_dataset_folder(folder: str | Path) -> None:
    """Fail naming the first problem unless a Parquet dataset folder holds exactly the
    files its ``_manifest.json`` lists, unchanged (sizes, and content where mtimes moved)."""
    problems = check_directory(folder, name=DATASET_MANIFEST)
    if problems:
        raise DamagedFileError(folder, problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))


def scan_extractions(directories: Iterable[str | Path]) -> dict[str, list[str]]:
    """{folder: problems} for the existing folders among ``directories`` that are not whole.

    Folders that do not exist are Snakemake's business (it will run their jobs).
    """
    damaged = {}
    for directory in directories:
        if os.path.isdir(directory):
            problems = check_directory(directory)
            if problems:
                damaged[str(directory)] = problems
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


def quarantine(path: str | Path) -> Path | None:
    """Move a damaged result aside (``<name>.damaged``), so Snakemake sees it missing and
    rebuilds it on the next run; kept, not deleted, for a look at what went wrong.

    A file inside an extraction folder takes the whole folder with it (the folder is
    the job's output). Returns the new path, or None when there is nothing to move.
    """
    path = Path(path)
    in_extraction = re.fullmatch(r"layer\d+(\.queries|\.tokens)?\.parquet", path.name) and re.fullmatch(
        r"layers[\d_-]+", path.parent.name
    )
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


_INSPECT_FLAGS = ("--lint", "--report", "--list", "--summary", "--detailed-summary", "--dag", "--rulegraph", "--filegraph",
                  "--d3dag", "--unlock", "--cleanup-metadata", "--list-changes", "--touch", "--delete-all-output",
                  "--delete-temp-output", "--archive", "--containerize", "--export-cwl", "--generate-unit-tests")  # fmt: skip


def invocation_mode(argv: list[str]) -> str:
    """'run', 'dry-run' or 'inspect' (lint, report, graphs...), from Snakemake's command line.

    While the Snakefile is parsed, Snakemake does not yet say whether it will execute
    jobs; moving damaged results aside must happen only when it will.
    """
    for arg in argv[1:]:
        if arg in ("-n", "--dry-run", "--dryrun", "--just-print") or (
            arg.startswith("-") and not arg.startswith("--") and "n" in arg[1:] and arg[1:].isalpha()
        ):
            return "dry-run"
        if any(arg == flag or arg.startswith(flag + "-") or arg.startswith(flag + "=") for flag in _INSPECT_FLAGS):
            return "inspect"
    return "run"


LOCAL_EXECUTORS = ("local", "dryrun", "touch")


def requested_executor(argv: list[str], workflow_dir: str | Path, environ: Mapping[str, str] | None = None) -> str:
    """The executor Snakemake will use ('local' unless one is named), from its command
    line, else the workflow profile, else the user profile.

    Snakemake parses the Snakefile before it sets up the executor, so while parsing,
    ``workflow.local_exec`` is true even for ``--executor slurm``; checks of this
    machine (devices, memory) must not apply to jobs that run elsewhere.
    """
    environ = os.environ if environ is None else environ
    value = _argument(argv, ("--executor", "-e"))
    if value:
        return value
    profiles = [_argument(argv, ("--workflow-profile",)) or str(Path(workflow_dir, "profiles", "default")),
                _argument(argv, ("--profile",)) or environ.get("SNAKEMAKE_PROFILE")]  # fmt: skip
    for profile in profiles:
        if not profile or profile == "none":
            continue
        for folder in (Path(profile), Path.home() / ".config" / "snakemake" / profile, Path("/etc/xdg/snakemake", profile)):
            for name in ("config.v8+.yaml", "config.yaml"):
                if (folder / name).is_file():
                    import yaml

                    try:
                        settings = yaml.safe_load((folder / name).read_text()) or {}
                    except (OSError, yaml.YAMLError):
                        settings = {}
                    if isinstance(settings, Mapping) and settings.get("executor"):
                        return str(settings["executor"])
                    break
            else:
                continue
            break
    return "local"


def _argument(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` on a command line (``--x v`` or ``--x=v``)."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "=") and name.startswith("--"):
                found = arg.split("=", 1)[1]
    return found


def forget_inventory(workdir: str | Path = ".") -> None:
    """Drop the file inventory a Snakemake dry run saves for the next run to reuse
    (``.snakemake/iocache/latest.pkl``): after results are moved aside it is stale."""
    Path(workdir, ".snakemake", "iocache", "latest.pkl").unlink(missing_ok=True)
