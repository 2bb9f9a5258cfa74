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


def _note_attention_kernels(records: Sequence[Mapping[str, Any]], what: str) -> None:
    """Log where layer files of one source came from different attention kernels: their videos
    differ by about 1% (as jobs of the fused route's do), so the source is kept, and said so."""
    kernels = sorted({record["attention_kernel"] for record in records if "attention_kernel" in record})
    if len(kernels) > 1:
        log.warning(
            "%s mixes attention kernels (%s): its layer groups come from slightly different videos; pin "
            "capture.attention_kernel for one video per run",
            what,
            ", ".join(kernels),
        )


class _SourceRows:
    """What one source's inputs hold, read and checked: the rows of every layer file, the
    token files, each video's block similarities and each file's provenance."""

    def __init__(self) -> None:
        self.frames: list[pd.DataFrame] = []
        self.queries: list[pd.DataFrame] = []
        self.token_files: list[tuple[Path, Path]] = []  # (file, its extraction folder)
        self.rollout: list[pd.DataFrame] = []  # per extraction folder: its video's block similarities
        self.records: list[dict[str, Any]] = []
        self.model_configs: dict[str, Any] = {}

    def add(self, entry: Path) -> None:
        """An extraction folder (its manifest verified, its rows checked against the calls
        its generation made) or an imported table."""
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
            self.frames.append(frame)
            record = _source_record(path, meta)
            if contents is not None:
                # Provenance, as torch_version: FlashAttention-4 and cuDNN round differently. A
                # folder from before the kernel was recorded ran cuDNN or PyTorch's own.
                route = contents.get("capture_route", {})
                record["attention_kernel"] = route.get("attention_kernel", "not recorded")
            self.records.append(record)
            if "model_config" in meta:
                self.model_configs[json.dumps(meta["model_config"], sort_keys=True)] = meta["model_config"]
        if contents is not None and contents.get("rollout") and self.frames:
            run = self.frames[-1].iloc[0]
            self.rollout.append(pd.DataFrame(contents["rollout"]).assign(**{key: run[key] for key in RUN_KEYS}))
        self.queries += [_read_checked(path, manifest) for path in files["queries"]]
        self.token_files += [(path, entry) for path in files["tokens"]]

    def tables(self, thresholds: Mapping[str, Any], sink_frames: int) -> dict[str, pd.DataFrame]:
        """The source's tables, by name."""
        frame = pd.concat(self.frames, ignore_index=True)
        queries = pd.concat(self.queries, ignore_index=True) if self.queries else None
        first_k = int(thresholds.get("first_k", 3))
        rollout = pd.concat(self.rollout, ignore_index=True) if self.rollout else None
        diagnostics = head_diagnostics(frame, queries, thresholds)
        return {
            "frame_attention": frame,
            "query_stats": queries if queries is not None else pd.DataFrame(columns=SCHEMAS["query_stats"].names),
            "head_stats": head_stats(frame, first_k),
            "layer_stats": layer_stats(frame, first_k),
            "block_stats": block_stats(frame, sink_frames, rollout),
            "head_diagnostics": diagnostics,
        }


def _link_dataset(folder: Path, files: Sequence[tuple[Path, Path]], meta: Mapping[str, Any]) -> None:
    """A Parquet dataset folder made anew of ``files`` ((file, its path in the folder)),
    linked where they lie, and its manifest."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for source, relative in files:
        _link_or_copy(source, folder / relative)
    write_manifest(folder, [relative.as_posix() for _, relative in files], meta, name=DATASET_MANIFEST)


def aggregate_job(inputs: Sequence[str | Path], outputs: Mapping[str, str | Path], params: Mapping[str, Any]) -> None:
    """One source's extraction folders (or imported file) -> its tables, figures' inputs."""
    began = time.perf_counter()
    name = params["name"]
    rows = _SourceRows()
    for entry in map(Path, inputs):
        rows.add(entry)
    _check_precision(rows.records, f"source {name!r}")
    _note_attention_kernels(rows.records, f"source {name!r}")
    thresholds = dict(params.get("diagnostics") or {})
    metadata = {
        **provenance("aggregate_source"),
        "checkpoint": name,
        "model_config": next(iter(rows.model_configs.values()), None),
        "frame_grid": read_metadata(rows.records[0]["file"]).get("frame_grid") if rows.records else None,
        "sources": rows.records,
        "diagnostics": thresholds,
    }
    tables = rows.tables(thresholds, int(params.get("sink_frames", 0)))
    for table, frame in tables.items():
        write_table(
            frame,
            outputs[table],
            SCHEMAS[table],
            metadata,
            row_groups_by="block" if table == "frame_attention" else None,
        )
    with atomic_path(outputs["head_classes"]) as tmp:
        head_class_grid(tables["head_diagnostics"]).to_csv(tmp)
    # Token profiles: the extraction files themselves, linked into a Parquet dataset folder.
    linked = [
        (path, Path(folder.parent.parent.name, folder.parent.name, folder.name, path.name))
        for path, folder in rows.token_files
    ]
    _link_dataset(Path(outputs["token_profiles"]), linked, {"table": "token_profiles", "source": name})
    log.info(
        "aggregated %d files, %d frame rows, %d token files for %s in %.2f s",
        len(rows.records),
        len(tables["frame_attention"]),
        len(rows.token_files),
        name,
        time.perf_counter() - began,
    )


def combine_job(inputs: Mapping[str, Sequence[str | Path]], outputs: Mapping[str, str | Path]) -> None:
    """Concatenate the per-source tables into results/tables/ (token profiles: linked)."""
    for table, paths in inputs.items():
        if table == "token_profiles":
            linked = []
            for source_folder in map(Path, paths):
                check_dataset_folder(source_folder)
                for name in sorted(read_manifest(source_folder, DATASET_MANIFEST)["files"]):
                    linked.append((source_folder / name, Path(source_folder.parent.name, name)))
            meta = {"table": "token_profiles", "sources": [str(p) for p in paths]}
            _link_dataset(Path(outputs[table]), linked, meta)
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
