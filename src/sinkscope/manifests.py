"""Manifests: a folder that lists its files with size, mtime and sha256, so a lost,
damaged or stray file is seen by a stat call (and the hash, when its mtime changed).

Extraction folders list their files in ``manifest.json``; Parquet dataset folders (token
profiles) in ``_manifest.json``, which dataset readers skip. A base module: the jobs that
write these folders and every reader of them (aggregation, figures) use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sinkscope.errors import DamagedFileError
from sinkscope.io import atomic_path

MANIFEST = "manifest.json"
# Parquet dataset folders (token profiles) list their files in "_manifest.json": dataset
# readers skip names starting with "_", so the folder stays a plain Parquet dataset.
DATASET_MANIFEST = "_manifest.json"


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


# Beside a manifest, the files' mtimes when it was written: the cheap check hashes a file
# only when its mtime changed. Kept out of the manifest, so that a folder's results are
# byte-identical across runs; a hidden name, so that folder readers never see it.
STAT_SIDECAR = ".mtimes.json"
# Files up to this size are hashed by every check, whatever their mtime says (a damaged
# file whose mtime was put back is still seen); larger ones only when their mtime changed.
HASH_ALWAYS_BYTES = 8 * 2**20


def write_manifest(
    directory: str | Path, files: Iterable[str], contents: Mapping[str, Any], name: str = MANIFEST
) -> None:
    """Record ``files`` (paths relative to ``directory``) and what they hold; written last.

    The manifest carries a digest of itself, so that a damaged manifest is named as the
    culprit rather than the file it no longer matches."""
    directory = Path(directory)
    manifest = {
        "files": {file: file_record(directory / file) for file in sorted(files)},
        "contents": dict(contents),
    }
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    mtimes = {file: (directory / file).stat().st_mtime_ns for file in manifest["files"]}
    with atomic_path(directory / _sidecar(name)) as tmp:
        tmp.write_text(json.dumps(mtimes, sort_keys=True))
    with atomic_path(directory / name) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def _sidecar(name: str) -> str:
    return STAT_SIDECAR if name == MANIFEST else f"{name.removesuffix('.json')}{STAT_SIDECAR}"


def _manifest_digest(manifest: Mapping[str, Any]) -> str:
    body = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_manifest(directory: str | Path, name: str = MANIFEST) -> dict[str, Any]:
    path = Path(directory) / name
    if not path.is_file():
        raise DamagedFileError(directory, f"incomplete: it has no {name} (the job that wrote it did not finish)")
    try:
        manifest = json.loads(path.read_text())
        manifest["files"], manifest["contents"]  # noqa: B018 - both must exist
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise DamagedFileError(path, "is damaged (not the JSON manifest sinkscope writes)") from None
    if "manifest_sha256" in manifest and manifest["manifest_sha256"] != _manifest_digest(manifest):
        raise DamagedFileError(
            path, "is damaged: it does not match its own digest (the manifest, not the files it lists)"
        )
    return manifest


def check_directory(directory: str | Path, *, full: bool = False, name: str = MANIFEST) -> list[str]:
    """Problems of one extraction folder against its manifest ([] when it is whole).

    By default sizes are compared, files up to ``HASH_ALWAYS_BYTES`` hashed, and larger
    ones hashed only when their mtime changed (a touch is not damage); ``full`` hashes
    every file.
    """
    directory = Path(directory)
    try:
        manifest = read_manifest(directory, name)
    except DamagedFileError as exc:
        return [str(exc)]
    try:
        mtimes = json.loads((directory / _sidecar(name)).read_text())
    except (OSError, ValueError):
        mtimes = {}
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
        # An older manifest kept the mtime in the record; without either, hash.
        elif (
            full
            or stat.st_size <= HASH_ALWAYS_BYTES
            or stat.st_mtime_ns != mtimes.get(listed_name, record.get("mtime_ns"))
        ) and file_sha256(path) != record["sha256"]:
            problems.append(f"{path}: damaged (its content changed after it was written)")
    listed = set(manifest["files"]) | {name, _sidecar(name)}
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
