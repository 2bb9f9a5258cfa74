"""The aggregation jobs: every extraction of a source -> its tables; sources -> the study's.

Before anything is written, every input is verified: its folder's manifest, each file's
sha256, page checksums and content digests, and its rows against what the generation
must produce. Runs computed in different precisions (device kind, dtype) are refused
by name rather than mixed in one table.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sinkscope.errors import DamagedFileError, SinkscopeError
from sinkscope.io import atomic_path
from sinkscope.manifests import (
    DATASET_MANIFEST,
    check_dataset_folder,
    read_manifest,
    write_manifest,
)
from sinkscope.naming import decode_layers, is_group_folder, layer_file
from sinkscope.pipeline.integrity import check_layer_rows, verify_file
from sinkscope.pipeline.jobs import provenance
from sinkscope.stats.summaries import (
    block_stats,
    head_class_grid,
    head_diagnostics,
    head_stats,
    layer_stats,
)
from sinkscope.tables import (
    RUN_KEYS,
    SCHEMAS,
    read_metadata,
    read_table,
    with_default_columns,
    write_table,
)

log = logging.getLogger("sinkscope")
_SOURCE_KEYS = (
    "checkpoint",
    "variant",
    "prompt_id",
    "seed",
    "layer",
    "config_hash",
    "checkpoint_digest",
    "device_name",
    "device_kind",
    "dtype",
    "torch_version",
    "package_version",
    "code_commit",
    "code_digest",
    "latents_sha256",
    "legacy_layout",
    "legacy_file",
    "legacy_file_sha256",
)


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def extraction_files(directory: str | Path) -> dict[str, list[Path]]:
    """A verified extraction folder's files by kind (frames, queries, tokens), in layer order."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    contents = manifest["contents"]
    if is_group_folder(directory.name):  # the workflow's folders name their layers
        expected = decode_layers(directory.name.removeprefix("layers"))
        if sorted(contents["layers"]) != sorted(expected):
            raise DamagedFileError(directory, f"holds layers {contents['layers']}, its name says {expected}")
    files: dict[str, list[Path]] = {"frames": [], "queries": [], "tokens": []}
    for layer in contents["layers"]:
        for kind in files:
            path = Path(layer_file(directory, layer, kind))
            if path.name in manifest["files"]:
                verify_file(path, manifest)
                files[kind].append(path)
        if not files["frames"] or files["frames"][-1].name != Path(layer_file(directory, layer)).name:
            raise DamagedFileError(directory, f"its manifest lists no frame file for layer {layer}")
    return files


def _read_checked(path: Path, manifest: Mapping[str, Any] | None) -> pd.DataFrame:
    table = read_table(path)
    if manifest is not None:
        recorded = manifest["contents"]["rows"].get(path.name)
        if recorded is not None and recorded != len(table):
            raise DamagedFileError(path, f"holds {len(table)} rows, its job wrote {recorded}")
    return table


def _source_record(path: Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    return {key: meta.get(key) for key in _SOURCE_KEYS if key in meta} | {"file": str(path)}


def _check_precision(records: Sequence[Mapping[str, Any]], what: str) -> None:
    kinds: dict[tuple, list[str]] = {}
    for record in records:
        if "dtype" in record:
            kinds.setdefault((record.get("device_kind"), record["dtype"]), []).append(record["file"])
    if len(kinds) > 1:
        described = "; ".join(
            f"{dtype} on {device}: {files[0]}" + (f" (+{len(files) - 1} more)" if len(files) > 1 else "")
            for (device, dtype), files in sorted(kinds.items(), key=str)
        )
        raise SinkscopeError(
            f"{what} mixes precisions ({described}); extract them all on one device kind "
            "and dtype (config device / checkpoints.<name>.dtype), e.g. snakemake --forcerun extract_attention"
        )


def aggregate_job(inputs: Sequence[str | Path], outputs: Mapping[str, str | Path], params: Mapping[str, Any]) -> None:
    """One source's extraction folders (or imported file) -> its tables, figures' inputs."""
    began = time.perf_counter()
    name = params["name"]
    parts: dict[str, list[pd.DataFrame]] = {"frames": [], "queries": []}
    token_files: list[tuple[Path, Path]] = []
    rollout: list[pd.DataFrame] = []  # per extraction folder: its video's block similarities
    records, model_configs = [], {}
    for entry in map(Path, inputs):
        if entry.is_dir():
            manifest = read_manifest(entry)
            files = extraction_files(entry)
            contents = manifest["contents"]
        else:
            manifest, files, contents = None, {"frames": [entry], "queries": [], "tokens": []}, None
        for path in files["frames"]:
            meta = read_metadata(path)
            frame = with_default_columns(_read_checked(path, manifest), meta.get("frame_seq_length"))
            if contents is not None:
                layer = int(frame["layer"].iloc[0]) if len(frame) else -1
                check_layer_rows(
                    frame, layer=layer, calls=contents["num_calls"], heads=contents["num_heads"], where=str(path)
                )
            parts["frames"].append(frame)
            records.append(_source_record(path, meta))
            if "model_config" in meta:
                model_configs[json.dumps(meta["model_config"], sort_keys=True)] = meta["model_config"]
        if contents is not None and contents.get("rollout") and parts["frames"]:
            run = parts["frames"][-1].iloc[0]
            rollout.append(pd.DataFrame(contents["rollout"]).assign(**{key: run[key] for key in RUN_KEYS}))
        parts["queries"] += [_read_checked(path, manifest) for path in files["queries"]]
        token_files += [(path, entry) for path in files["tokens"]]
    _check_precision(records, f"source {name!r}")
    frame = pd.concat(parts["frames"], ignore_index=True)
    queries = pd.concat(parts["queries"], ignore_index=True) if parts["queries"] else None
    thresholds = dict(params.get("diagnostics") or {})
    first_k = int(thresholds.get("first_k", 3))
    metadata = {
        **provenance("aggregate_source"),
        "checkpoint": name,
        "model_config": next(iter(model_configs.values()), None),
        "frame_grid": read_metadata(records[0]["file"]).get("frame_grid") if records else None,
        "sources": records,
        "diagnostics": thresholds,
    }
    diagnostics = head_diagnostics(frame, queries, thresholds)
    tables = {
        "frame_attention": frame,
        "query_stats": queries if queries is not None else pd.DataFrame(columns=SCHEMAS["query_stats"].names),
        "head_stats": head_stats(frame, first_k),
        "layer_stats": layer_stats(frame, first_k),
        "block_stats": block_stats(
            frame, int(params.get("sink_frames", 0)), pd.concat(rollout, ignore_index=True) if rollout else None
        ),
        "head_diagnostics": diagnostics,
    }
    for table, rows in tables.items():
        write_table(
            rows,
            outputs[table],
            SCHEMAS[table],
            metadata,
            row_groups_by="block" if table == "frame_attention" else None,
        )
    with atomic_path(outputs["head_classes"]) as tmp:
        head_class_grid(diagnostics).to_csv(tmp)
    # Token profiles: the extraction files themselves, linked into a Parquet dataset folder.
    folder = Path(outputs["token_profiles"])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    linked = []
    for path, directory in token_files:
        relative = Path(directory.parent.parent.name, directory.parent.name, directory.name, path.name)
        _link_or_copy(path, folder / relative)
        linked.append(relative.as_posix())
    write_manifest(folder, linked, {"table": "token_profiles", "source": name}, name=DATASET_MANIFEST)
    log.info(
        "aggregated %d files, %d frame rows, %d token files for %s in %.2f s",
        len(records),
        len(frame),
        len(token_files),
        name,
        time.perf_counter() - began,
    )


def combine_job(inputs: Mapping[str, Sequence[str | Path]], outputs: Mapping[str, str | Path]) -> None:
    """Concatenate the per-source tables into results/tables/ (token profiles: linked)."""
    for table, paths in inputs.items():
        if table == "token_profiles":
            folder = Path(outputs[table])
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            linked = []
            for source_folder in map(Path, paths):
                check_dataset_folder(source_folder)
                for name in sorted(read_manifest(source_folder, DATASET_MANIFEST)["files"]):
                    relative = Path(source_folder.parent.name, name)
                    _link_or_copy(source_folder / name, folder / relative)
                    linked.append(relative.as_posix())
            write_manifest(
                folder, linked, {"table": "token_profiles", "sources": [str(p) for p in paths]}, name=DATASET_MANIFEST
            )
            continue
        frame = read_table(paths)
        parts = [read_metadata(path) for path in paths]
        _check_precision(
            [source for part in parts for source in part.get("sources", [])], "the study (results/tables/)"
        )
        metadata = {
            **provenance("combine_tables"),
            "checkpoints": sorted(set(frame["checkpoint"])) if len(frame) else [],
            "model_configs": {part.get("checkpoint"): part.get("model_config") for part in parts},
            "frame_grids": {part.get("checkpoint"): part.get("frame_grid") for part in parts},
            "sources": [source for part in parts for source in part.get("sources", [])],
        }
        write_table(frame, outputs[table], SCHEMAS[table], metadata)
        log.info("%s: %d rows from %d source tables", table, len(frame), len(paths))
