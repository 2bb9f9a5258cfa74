"""One function per pipeline job; the Snakemake scripts and the CLI call these.

Each job reads its inputs, does its one thing through the package modules, and
writes its outputs atomically, with provenance in the Parquet metadata.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import CheckpointSpec, stable_hash
from .tables import (
    FRAME_ATTENTION_SCHEMA,
    HEAD_STATS_SCHEMA,
    LAYER_STATS_SCHEMA,
    head_stats,
    layer_stats,
    read_metadata,
    read_table,
    write_table,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger("sinkscope")


def log_to(path: str | Path | None) -> None:
    """Send this job's log records and stderr (tracebacks included) to ``path``."""
    import sys

    if path is None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the job
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)


def pick_device(option: str = "auto") -> "torch.device":
    """auto: the first visible CUDA device (Slurm's CUDA_VISIBLE_DEVICES is honoured), else CPU."""
    import torch

    if option == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(option)
    if device.type == "cuda":
        visible = torch.cuda.device_count()
        if not visible:
            raise RuntimeError(f"device {option!r} was asked for, but no CUDA device is visible")
        if (device.index or 0) >= visible:
            raise RuntimeError(f"device {option!r} was asked for, but only {visible} CUDA device(s) are visible")
    return device


def device_name(device: "torch.device") -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def software_provenance(device: "torch.device") -> dict[str, Any]:
    import torch

    return {
        "package_version": __version__,
        "torch_version": torch.__version__,
        "device_name": device_name(device),
        "python_version": platform.python_version(),
    }


# -- prompts -------------------------------------------------------------------


def encode_prompt_job(encoder: Mapping[str, Any], prompt_id: str, text: str, output: str | Path, device: str = "auto") -> None:
    """Write one prompt's context embedding for one text encoder."""
    from .text import TextEncoderSpec, encode_prompts, save_embedding

    spec = TextEncoderSpec(**encoder)
    began = time.perf_counter()
    context = encode_prompts(spec, {prompt_id: text}, device=pick_device(device))[prompt_id]
    save_embedding(output, context, prompt=text, encoder=spec)
    log.info("encoded prompt %s with %s: %s tokens in %.2f s", prompt_id, spec.key, tuple(context.shape), time.perf_counter() - began)


# -- extraction ----------------------------------------------------------------------------


def extract_job(
    *,
    checkpoint: Mapping[str, Any],
    prompt_id: str,
    seed: int,
    layers: Sequence[int],
    outputs: Sequence[str | Path],
    embedding: str | Path,
    weights_sha256: str,
    generation: Mapping[str, Any],
    backend: str = "auto",
    device: str = "auto",
    compile: bool = False,
    base_dir: str | Path = ".",
) -> dict[str, Any]:
    """Generate one video, capture ``layers``, write one frame_attention Parquet per layer.

    ``compile`` runs the tensor work around attention through torch.compile (CUDA only;
    it pays off when one job generates for many layers, see docs/performance.md).
    """
    job_began = time.perf_counter()
    from .capture import FrameStatsCapture
    from .generation import GenerationOptions, generate
    from .model.loading import load_checkpoint
    from .text import load_embedding

    if len(layers) != len(outputs):
        raise ValueError(f"{len(layers)} layers but {len(outputs)} output paths")
    spec = CheckpointSpec(**checkpoint)
    options = GenerationOptions.from_dict(dict(generation))
    target = pick_device(device)
    began = time.perf_counter()
    timings: dict[str, float] = {"startup_seconds": began - job_began}  # torch import, CUDA set-up
    model = load_checkpoint(spec, device=target, base_dir=base_dir)
    timings["load_seconds"] = time.perf_counter() - began
    if compile and target.type == "cuda":
        model.compile_blocks(dynamic=False)
    context, context_meta = load_embedding(embedding)
    config = model.config
    frame_seq_length = config.frame_seq_length(options.latent_height or None, options.latent_width or None)
    log.info(
        "extracting %s / %s / seed %d, layers %s on %s (%s; CUDA_VISIBLE_DEVICES=%s; %s)",
        spec.name, prompt_id, seed, list(layers), device_name(target), model.dtype,
        os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), config.to_json(),
    )  # fmt: skip

    with FrameStatsCapture(model, layers, frame_seq_length=frame_seq_length, backend=backend) as capture:
        result = generate(model, context[None], options=options, seed=seed, observers=[capture])
    timings["generation_seconds"] = result.seconds
    began = time.perf_counter()
    rows = capture.to_frame()
    timings["collect_seconds"] = time.perf_counter() - began
    rows.insert(0, "seed", int(seed))
    rows.insert(0, "prompt_id", prompt_id)
    rows.insert(0, "checkpoint", spec.name)

    latents_sha = hashlib.sha256(result.latents.float().cpu().numpy().tobytes()).hexdigest()
    job_config = {
        "checkpoint": spec.to_dict(),
        "generation": options.to_dict(),
        "prompt": context_meta.get("prompt"),
        "seed": int(seed),
        "backend": backend,
        "compile": bool(compile),
    }
    metadata = {
        **software_provenance(target),
        "config_hash": stable_hash(job_config),
        "checkpoint_digest": weights_sha256,
        "model_config": config.to_dict(),
        "generation": options.to_dict(),
        "checkpoint": spec.to_dict(),
        "prompt_id": prompt_id,
        "prompt": context_meta.get("prompt", ""),
        "text_encoder": context_meta.get("encoder", ""),
        "seed": int(seed),
        "dtype": str(model.dtype).replace("torch.", ""),
        "frame_seq_length": frame_seq_length,
        "block_sizes": options.block_sizes(),
        "layers_in_job": list(layers),
        "num_calls": len(result.calls),
        "latents_sha256": latents_sha,
        "peak_memory_bytes": result.peak_memory_bytes,
        "kv_cache_bytes": result.kv_cache_bytes,
        "timings": timings,
    }
    began = time.perf_counter()
    for layer, path in zip(layers, outputs):
        write_table(rows[rows["layer"] == layer], path, FRAME_ATTENTION_SCHEMA, {**metadata, "layer": int(layer)})
    timings["write_seconds"] = time.perf_counter() - began
    log.info(
        "generation %.2f s (%d calls), load %.2f s, write %.2f s; %d rows a layer; latents sha256 %s",
        result.seconds, len(result.calls), timings["load_seconds"], timings["write_seconds"],
        len(rows) // max(1, len(layers)), latents_sha[:16],
    )  # fmt: skip
    return metadata


# -- aggregation ---------------------------------------------------------------------------

_SOURCE_KEYS = ("checkpoint", "prompt_id", "seed", "layer", "config_hash", "checkpoint_digest", "device_name",
                "torch_version", "package_version", "latents_sha256", "legacy_layout", "legacy_file",
                "legacy_file_sha256")  # fmt: skip


def aggregate_job(inputs: Sequence[str | Path], outputs: Mapping[str, str | Path], name: str) -> None:
    """Per checkpoint: concatenate the per-job files; write frame_attention, head_stats, layer_stats."""
    began = time.perf_counter()
    frame = read_table(inputs)
    sources = []
    model_configs = {}
    for path in inputs:
        meta = read_metadata(path)
        sources.append({key: meta.get(key) for key in _SOURCE_KEYS if key in meta} | {"file": str(path)})
        if "model_config" in meta:
            model_configs[json.dumps(meta["model_config"], sort_keys=True)] = meta["model_config"]
    metadata = {
        "package_version": __version__,
        "checkpoint": name,
        "model_config": next(iter(model_configs.values()), None),
        "sources": sources,
    }
    write_table(frame, outputs["frame_attention"], FRAME_ATTENTION_SCHEMA, metadata)
    write_table(head_stats(frame), outputs["head_stats"], HEAD_STATS_SCHEMA, metadata)
    write_table(layer_stats(frame), outputs["layer_stats"], LAYER_STATS_SCHEMA, metadata)
    log.info("aggregated %d files, %d rows for %s in %.2f s", len(inputs), len(frame), name, time.perf_counter() - began)


def combine_job(inputs: Mapping[str, Sequence[str | Path]], outputs: Mapping[str, str | Path]) -> None:
    """Concatenate the per-checkpoint tables into results/tables/*.parquet."""
    schemas = {"frame_attention": FRAME_ATTENTION_SCHEMA, "head_stats": HEAD_STATS_SCHEMA, "layer_stats": LAYER_STATS_SCHEMA}
    for table, paths in inputs.items():
        frame = read_table(paths)
        parts = [read_metadata(path) for path in paths]
        metadata = {
            "package_version": __version__,
            "checkpoints": sorted(set(frame["checkpoint"])),
            "model_configs": {part.get("checkpoint"): part.get("model_config") for part in parts},
            "sources": [source for part in parts for source in part.get("sources", [])],
        }
        write_table(frame, outputs[table], schemas[table], metadata)
        log.info("%s: %d rows from %d checkpoint tables", table, len(frame), len(paths))


# -- figures and the summary page ----------------------------------------------------------


def frame_files(inputs: Sequence[str | Path], layer: int | None = None) -> list[Path]:
    """Expand extraction folders into their per-layer Parquet files (only ``layer``'s if given)."""
    files: list[Path] = []
    for entry in map(Path, inputs):
        if entry.is_dir():
            pattern = "layer*.parquet" if layer is None else f"layer{layer}.parquet"
            found = sorted(entry.glob(pattern))
            if not found:
                raise FileNotFoundError(f"no {pattern} in {entry}")
            files.extend(found)
        else:
            files.append(entry)
    return files


def figure_job(
    *,
    kind: str,
    inputs: Sequence[str | Path],
    source: str,
    layer: int | None,
    options: Mapping[str, Any],
    svg: str | Path,
    png: str | Path,
    checkpoint: str | None = None,
) -> None:
    """Draw one figure; rows of several checkpoints need ``checkpoint`` to pick one."""
    from .figures import draw, save_figure

    began = time.perf_counter()
    frame = read_table(inputs)
    present = sorted(set(frame["checkpoint"]))
    if checkpoint is not None:
        if checkpoint not in present:
            raise ValueError(f"checkpoint {checkpoint!r} is not in the input (it has {', '.join(present)})")
        frame = frame[frame["checkpoint"] == checkpoint]
    elif len(present) > 1:
        raise ValueError(f"the input holds several checkpoints ({', '.join(present)}); choose one (--checkpoint)")
    if layer is not None:
        frame = frame[frame["layer"] == layer]
    fig = draw(kind, frame, source=source, layer=layer, options=options)
    save_figure(fig, svg, png, dpi=int(options.get("dpi", 200)))
    log.info("drew %s of %s%s in %.2f s", kind, source, "" if layer is None else f" layer {layer}", time.perf_counter() - began)


def summary_job(layer_stats_path: str | Path, head_stats_path: str | Path, output: str | Path, options: Mapping[str, Any]) -> None:
    from .report import summary_html

    html = summary_html(read_table(layer_stats_path), read_table(head_stats_path), options)
    from .io import atomic_path

    with atomic_path(output) as tmp:
        tmp.write_text(html)
    log.info("wrote the summary page %s", output)


# -- legacy caches -------------------------------------------------------------------------


def import_job(path: str | Path, output: str | Path, name: str, entry: Mapping[str, Any]) -> None:
    """Convert one older extraction script's .pt cache into frame_attention rows."""
    from .legacy import import_to_parquet

    import_to_parquet(
        path,
        output,
        checkpoint=name,
        prompt_id=entry.get("prompt_id"),
        seed=int(entry.get("seed", 0)),
        allow_pickle=bool(entry.get("allow_pickle", False)),
    )
