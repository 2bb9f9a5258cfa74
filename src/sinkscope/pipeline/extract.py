"""The extraction job: generate one video, capture a group of layers, write their files.

One job = one (checkpoint, variant, prompt, seed, layer group); a prompt may be a
schedule of segments (one embedding file each, switched at their start frames). It
writes, per layer, ``layer<L>.parquet`` (frame_attention rows, one row group per block),
``layer<L>.queries.parquet`` (query_stats) and, with token capture,
``layer<L>.tokens.parquet`` (token_profiles), the run's final latents
(``latents.safetensors``, [C, F, H, W] float32: ``sinkscope.pipeline.latents``), then
``manifest.json`` last. The rows are
written while the video is generated (``sinkscope.pipeline.writing``: writer threads on
CUDA, inline on CPU). The folder is built beside its final place and swapped in whole,
so a reader never sees half of it; before the files are closed and the folder swapped
in, the job checks its rows against what the generation must produce, and any failure
(of the generation, of a writer thread, of the check) leaves the previous result.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sinkscope.errors import DamagedFileError, SinkscopeError
from sinkscope.interventions import class_selections, read_head_classes, with_head_classes
from sinkscope.manifests import write_manifest
from sinkscope.model.checkpoints import CheckpointSpec, resolve_checkpoint
from sinkscope.naming import stable_hash
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.config import CAPTURE_STATISTICS
from sinkscope.pipeline.integrity import check_layer_rows
from sinkscope.pipeline.jobs import cuda_visible_devices, pick_device, provenance
from sinkscope.pipeline.latents import latents_sha256, write_latents
from sinkscope.stats.rollout import block_similarity

if TYPE_CHECKING:
    import torch

log = logging.getLogger("sinkscope")

# capture.compile: auto compiles from this rollout length on: the rollout length where
# the time compiling saves a latent frame repays compiling with Inductor's on-disk cache
# warm (a study's later jobs on the node); docs/performance-history.md has the measurement.
COMPILE_AUTO_MIN_FRAMES = 120


def compile_wanted(setting: bool | str, device: torch.device, num_frames: int) -> bool:
    """Whether a job compiles the model's blocks: ``capture.compile`` true, false or
    ``auto`` (CUDA and a rollout of at least COMPILE_AUTO_MIN_FRAMES latent frames)."""
    if device.type != "cuda":
        return False
    if setting == "auto":
        return num_frames >= COMPILE_AUTO_MIN_FRAMES
    return bool(setting)


def _swap_in(built: Path, final: Path) -> None:
    """Replace the folder ``final`` by ``built`` (two renames; the old one removed after)."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(built, final)
    shutil.rmtree(old, ignore_errors=True)


def extract_job(
    *,
    checkpoint: Mapping[str, Any],
    variant: str,
    prompt_id: str,
    seed: int,
    layers: Sequence[int],
    output: str | Path,
    embedding: str | Path | Sequence[str | Path],
    weights_sha256: str,
    generation: Mapping[str, Any],
    capture: Mapping[str, Any],
    compute: Mapping[str, str],
    segment_starts: Sequence[int] = (0,),
    base_dir: str | Path = ".",
    head_classes: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Generate one video, capture ``layers``, write the extraction folder ``output``;
    returns the files' metadata plus ``timings`` (seconds: start-up, load, generation;
    ``handoff_seconds``: the generation's time handing each call's results to the writer;
    ``writer_busy_seconds``: the writers' time building and writing rows, summed over
    threads; ``collect_seconds``: after the generation, until the writers have written
    the records still queued and the last block's row groups (each layer on its
    worker); ``write_seconds``: the checks and the footers; the whole job).

    ``embedding``: the prompt's embedding file, or one file per prompt segment, the
    segments starting at ``segment_starts`` (latent frames; the first 0)."""
    job_began = time.perf_counter()
    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.generation.sampler import generate
    from sinkscope.pipeline.writing import ExtractionWriter, default_workers

    spec = CheckpointSpec(**checkpoint)
    options = _with_head_classes(GenerationOptions.from_config(generation), variant, head_classes)
    device = pick_device(compute["device"])
    began = time.perf_counter()
    timings: dict[str, float] = {"startup_seconds": began - job_began}
    model, vae, dtype, timings["load_seconds"] = _load_model(spec, options, device, compute, capture, base_dir, began)
    schedule, prompt, switches, context_meta = _prompt_schedule(embedding, segment_starts)
    run = _Run.of(model.config, spec, variant, options, prompt_id, seed, prompt, switches, layers, context_meta)
    run.log_start(device, dtype, capture)
    statistics = tuple(capture.get("statistics", CAPTURE_STATISTICS))
    output = Path(output)
    built = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(built, ignore_errors=True)
    built.mkdir(parents=True)
    columns = {"checkpoint": spec.name, "variant": variant, "prompt_id": prompt_id, "seed": int(seed)}
    workers = default_workers(device, len(layers))
    writer = ExtractionWriter(
        built, layers, frame_seq_length=run.frame_seq_length, run_columns=columns, workers=workers
    )
    try:
        recorder = FrameStatsCapture(
            model,
            layers,
            frame_seq_length=run.frame_seq_length,
            backend=capture["backend"],
            attention=capture["attention"],
            statistics=statistics,
            token_profiles=capture["token_profiles"],
            handoff=writer.submit,
        )
        with recorder:
            result = generate(model, schedule, options=options, seed=seed, observers=[recorder], vae=vae)
        timings["generation_seconds"] = result.seconds

        # The final latents [C, F, H, W] on the host once: their digest goes into every row, the
        # file beside the rows (pairing runs, decoding the video) holds the same bytes.
        latents = result.latents[0].float().cpu().numpy()
        latents_sha = latents_sha256(latents)
        latents_file = write_latents(built, latents)
        metadata = run.metadata(capture, compute, device, dtype, weights_sha256, result, latents_sha)
        written, counts = writer.finish(metadata, run.row_check(str(output)))
        timings["collect_seconds"] = writer.drain_seconds
        timings["write_seconds"] = writer.close_seconds
        timings.update(writer.timings)
        contents = run.manifest_contents(counts, device, dtype, latents, capture, model.kernels.name, recorder)
        write_manifest(built, [*written, latents_file], contents)
    except BaseException:
        # The generation, a writer thread or the check failed: nothing of this run stays.
        writer.abort()
        shutil.rmtree(built, ignore_errors=True)
        raise
    _swap_in(built, output)
    timings["job_seconds"] = time.perf_counter() - job_began
    log.info(
        "generation %.2f s (%d calls), load %.2f s, write %.2f s after it; latents sha256 %s; peak memory %s; "
        "timings %s",
        result.seconds,
        len(result.calls),
        timings["load_seconds"],
        timings["write_seconds"],
        latents_sha[:16],
        result.peak_memory_bytes,
        json.dumps({k: round(v, 4) for k, v in timings.items()}),
    )
    # Timings go back to the caller (and the log), never into the files.
    return {**metadata, "timings": timings}


def _with_head_classes(
    options: GenerationOptions, variant: str, head_classes: Sequence[str | Path]
) -> GenerationOptions:
    """The options with edits that select heads by class (``class:<label>``) turned into the
    untouched default run's heads of that class."""
    if not class_selections(options.interventions):
        return options
    if not head_classes:
        raise SinkscopeError(
            f"variant {variant!r} selects heads by class: its job needs the untouched default run's "
            "head classes (the workflow makes them first)"
        )
    edits = with_head_classes(options.interventions, read_head_classes(head_classes[0]))
    return dataclasses.replace(options, interventions=edits)


def _load_model(spec, options, device, compute, capture, base_dir, began: float):
    """The model, with its kernels set and compiled where wanted, the VAE its generation
    runs (Krea's re-encode of a context frame; else None), its dtype (the one the workflow
    planned) and the seconds since ``began`` once the weights are loaded."""
    from sinkscope.attention.settings import KernelSettings
    from sinkscope.generation.krea import load_reencode_vae
    from sinkscope.model.loading import load_checkpoint

    resolved = resolve_checkpoint(spec, base_dir)
    model = load_checkpoint(resolved, device=device)
    vae = load_reencode_vae(resolved, options, device)
    loaded = time.perf_counter() - began
    dtype = str(model.dtype).replace("torch.", "")
    if dtype != compute["dtype"]:
        raise SinkscopeError(f"checkpoint {spec.name!r} computes in {dtype}, the workflow planned {compute['dtype']}")
    model.kernels = KernelSettings.named(capture.get("kernels", "fast"))
    if compile_wanted(capture.get("compile", "auto"), device, options.num_frames):
        model.compile_blocks(dynamic=False)
    return model, vae, dtype, loaded


def _prompt_schedule(embedding: str | Path | Sequence[str | Path], segment_starts: Sequence[int]):
    """What the generation is conditioned on (one prompt's context, or the segments'
    (start frame, context, text)), the prompt as the rows record it (a text, or the
    segments), the frames where it switches, and the first embedding's metadata."""
    from sinkscope.model.text import load_embedding

    files = [embedding] if isinstance(embedding, (str, Path)) else list(embedding)
    starts = [int(f) for f in segment_starts]
    if len(files) != len(starts):
        raise SinkscopeError(f"{len(files)} prompt embeddings for {len(starts)} prompt segments")
    loaded = [load_embedding(file) for file in files]
    texts = [meta.get("prompt", "") for _, meta in loaded]
    switches = starts[1:]
    schedule = (
        loaded[0][0][None]
        if not switches
        else [(start, ctx[None], text) for start, (ctx, _), text in zip(starts, loaded, texts)]
    )
    prompt: str | list[dict[str, Any]] = texts[0]
    if switches:
        prompt = [{"text": text, "start_frame": start} for text, start in zip(texts, starts)]
    return schedule, prompt, switches, loaded[0][1]


@dataclasses.dataclass(frozen=True)
class _Run:
    """What one run is (the model's config, checkpoint, variant, options, prompt, seed,
    layers and the frames' token layout), as the job's log, rows and manifest state it."""

    config: Any
    spec: CheckpointSpec
    variant: str
    options: GenerationOptions
    prompt_id: str
    seed: int
    prompt: str | list[dict[str, Any]]
    switches: list[int]
    layers: Sequence[int]
    text_encoder: str
    frame_seq_length: int
    frame_grid: list[int]

    @classmethod
    def of(cls, config, spec, variant, options, prompt_id, seed, prompt, switches, layers, context_meta) -> _Run:
        height = options.latent_height or config.latent_height
        width = options.latent_width or config.latent_width
        return cls(
            config,
            spec,
            variant,
            options,
            prompt_id,
            int(seed),
            prompt,
            switches,
            layers,
            context_meta.get("encoder", ""),
            config.frame_seq_length(height, width),
            [height // config.patch_size[1], width // config.patch_size[2]],
        )

    def log_start(self, device, dtype: str, capture: Mapping[str, Any]) -> None:
        log.info(
            "extracting %s (%s) / %s / seed %d, layers %s on %s (%s; CUDA_VISIBLE_DEVICES=%s; policy %s; %s)",
            self.spec.name,
            self.variant,
            self.prompt_id,
            self.seed,
            list(self.layers),
            device,
            dtype,
            cuda_visible_devices(),
            self.options.cache_policy,
            self.config.to_json(),
        )

    def row_check(self, where: str):
        """The check of one layer's rows before its file is closed: every call and head of
        the generation, probabilities summing to 1."""
        calls = self.options.calls(self.switches)

        def check(layer: int, frames) -> None:
            try:
                check_layer_rows(frames, layer=layer, calls=calls, heads=self.config.num_heads, where=where)
            except DamagedFileError as error:
                # A computation that went wrong, not a damaged file: the previous result stays.
                raise SinkscopeError(
                    f"the generation's rows fail their check, nothing written: {error.problem}"
                ) from None

        return check

    def metadata(self, capture, compute, device, dtype, weights_sha256, result, latents_sha) -> dict[str, Any]:
        """The metadata every file of the run carries: provenance, the run's config and its
        hash, what was generated and how. Timings stay out: results are byte-identical
        across runs of the same code and inputs."""
        options = self.options
        job_config = {
            "checkpoint": self.spec.to_dict(),
            "variant": self.variant,
            "generation": options.to_dict(),
            "seed": self.seed,
            "prompt": self.prompt,
            "capture": dict(capture),
            "compute": dict(compute),
        }
        return {
            **provenance("extract_attention", device),
            "dtype": dtype,
            "config_hash": stable_hash(job_config),
            "checkpoint_digest": weights_sha256,
            "model_config": self.config.to_dict(),
            "generation": options.to_dict(),
            "checkpoint": self.spec.to_dict(),
            "variant": self.variant,
            "prompt_id": self.prompt_id,
            "prompt": self.prompt,
            "text_encoder": self.text_encoder,
            "seed": self.seed,
            "frame_seq_length": self.frame_seq_length,
            "frame_grid": self.frame_grid,
            "block_sizes": options.block_sizes(),
            "layers_in_job": list(self.layers),
            "num_calls": len(result.calls),
            **({"prompt_switches": self.switches} if self.switches else {}),
            "latents_sha256": latents_sha,
            "peak_memory_bytes": result.peak_memory_bytes,
            "kv_cache_bytes": result.kv_cache_bytes,
        }

    def manifest_contents(self, counts, device, dtype, latents, capture, kernels: str, recorder) -> dict[str, Any]:
        """What the folder's manifest says it holds, with the video's sink collapse (per
        block, how like the sink frames and the previous block the latents are)."""
        options = self.options
        return {
            "layers": [int(x) for x in self.layers],
            "rows": counts,
            "num_calls": options.calls(self.switches),
            "num_heads": self.config.num_heads,
            "device_kind": device.type,
            "dtype": dtype,
            "generation": options.to_dict(),
            "rollout": block_similarity(latents, options.block_sizes(), options.sink_frames, self.config.head_dim),
            # Whether latents_sha256 is the uncaptured video's, and the route that decides it.
            "capture_route": {
                "attention": capture["attention"],
                "statistics": list(capture.get("statistics", CAPTURE_STATISTICS)),
                "kernels": kernels,
                "video_exact": recorder.video_exact,
            },
        }
