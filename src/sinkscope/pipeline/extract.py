"""The extraction job: generate one video, capture a group of layers, write their files.

One run = one (checkpoint, variant, prompt, seed, layer group); a prompt may be a
schedule of segments (one embedding file each, switched at their start frames). A job is
one run (``extract_job``) or several runs of one checkpoint, prompt and seed, the model
loaded and compiled once (``extract_runs_job``: ``runs_per_job``, each run's folder as
``extract_job`` writes it, an interrupted job's finished runs kept for its next attempt).
A run writes, per layer, ``layer<L>.parquet`` (frame_attention rows, one row group per block),
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
from sinkscope.interventions import (
    atlas_selections,
    class_selections,
    read_selection_files,
    with_head_classes,
    with_head_orders,
)
from sinkscope.manifests import MANIFEST, check_directory, file_sha256, read_manifest, write_manifest
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
# A job of several runs counts the frames of all its runs: they share the compiled model.
# With the fused norm kernels an eager block is as fast as a compiled one (the 1.3B's 120
# frames under sink: 44.7 against 43.6 video FPS; docs/performance.md), so auto compiles
# only the blocks that run without them.
COMPILE_AUTO_MIN_FRAMES = 120


def compile_wanted(setting: bool | str, device: torch.device, num_frames: int, fused_norms: bool = False) -> bool:
    """Whether a job compiles the model's blocks: ``capture.compile`` true, false or
    ``auto`` (CUDA, a job of at least COMPILE_AUTO_MIN_FRAMES latent frames, its runs'
    together, and eager blocks without the fused norm kernels: ``fused_norms`` says whether
    they run them, ``sinkscope.model.wan.fused_norms_apply``)."""
    if device.type != "cuda":
        return False
    if setting == "auto":
        return num_frames >= COMPILE_AUTO_MIN_FRAMES and not fused_norms
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
    edit_files: Sequence[str | Path] = (),
) -> dict[str, Any]:
    """Generate one video, capture ``layers``, write the extraction folder ``output``;
    returns the files' metadata plus ``timings`` (seconds: start-up, load, generation;
    ``handoff_seconds``: the generation's time handing each call's results to the writer;
    ``writer_busy_seconds``: the writers' time building and writing rows, summed over
    threads; ``collect_seconds``: after the generation, until the writers have written
    the records still queued and the last block's row groups (each layer on its
    worker); ``write_seconds``: the checks and the footers; the whole job).

    ``embedding``: the prompt's embedding file, or one file per prompt segment, the
    segments starting at ``segment_starts`` (latent frames; the first 0). ``edit_files``:
    the untouched run's head classes and the head orders of the atlases the edits select
    heads by (``class:``, ``atlas:``)."""
    job_began = time.perf_counter()
    spec = CheckpointSpec(**checkpoint)
    options = resolved_edits(GenerationOptions.from_config(generation), variant, edit_files)
    device = pick_device(compute["device"])
    began = time.perf_counter()
    timings: dict[str, float] = {"startup_seconds": began - job_began}
    model, vae, dtype, timings["load_seconds"] = _load_model(
        spec, [options], device, compute, [capture], base_dir, began
    )
    schedule, prompt, switches, context_meta = _prompt_schedule(embedding, segment_starts)
    run = _Run.of(model.config, spec, variant, options, prompt_id, seed, prompt, switches, layers, context_meta)
    metadata, run_timings = _generate(
        model, vae, dtype, device, run, schedule, capture, compute, weights_sha256, output
    )
    timings.update(run_timings)
    timings["job_seconds"] = time.perf_counter() - job_began
    # Timings go back to the caller (and the log), never into the files.
    return {**metadata, "timings": timings}


def _generate(
    model,
    vae,
    dtype: str,
    device,
    run: _Run,
    schedule,
    capture: Mapping[str, Any],
    compute: Mapping[str, str],
    weights_sha256: str,
    output: str | Path,
    contents: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """One run on a loaded model: its video generated, its layers captured, its folder
    ``output`` written (built beside it and swapped in whole; ``contents``: more of what
    its manifest says it holds). Returns the files' metadata and the run's timings."""
    from sinkscope.generation.capture import FrameStatsCapture
    from sinkscope.generation.sampler import generate
    from sinkscope.pipeline.writing import ExtractionWriter, default_workers

    run.log_start(device, dtype, capture)
    statistics = tuple(capture.get("statistics", CAPTURE_STATISTICS))
    output = Path(output)
    built = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(built, ignore_errors=True)
    built.mkdir(parents=True)
    columns = {"checkpoint": run.spec.name, "variant": run.variant, "prompt_id": run.prompt_id, "seed": run.seed}
    workers = default_workers(device, len(run.layers))
    writer = ExtractionWriter(
        built, run.layers, frame_seq_length=run.frame_seq_length, run_columns=columns, workers=workers
    )
    timings: dict[str, float] = {}
    try:
        recorder = FrameStatsCapture(
            model,
            run.layers,
            frame_seq_length=run.frame_seq_length,
            backend=capture["backend"],
            attention=capture["attention"],
            statistics=statistics,
            token_profiles=capture["token_profiles"],
            handoff=writer.submit,
        )
        with recorder:
            result = generate(model, schedule, options=run.options, seed=run.seed, observers=[recorder], vae=vae)
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
        manifest = run.manifest_contents(counts, device, dtype, latents, capture, model.kernels, recorder)
        write_manifest(built, [*written, latents_file], {**manifest, **(contents or {})})
    except BaseException:
        # The generation, a writer thread or the check failed: nothing of this run stays.
        writer.abort()
        shutil.rmtree(built, ignore_errors=True)
        raise
    _swap_in(built, output)
    log.info(
        "generation %.2f s (%d calls), write %.2f s after it; latents sha256 %s; peak memory %s; timings %s",
        result.seconds,
        len(result.calls),
        timings["write_seconds"],
        latents_sha[:16],
        result.peak_memory_bytes,
        json.dumps({k: round(v, 4) for k, v in timings.items()}),
    )
    return metadata, timings


def extract_runs_job(
    *,
    job: Mapping[str, Any],
    prompt_id: str,
    seed: int,
    outputs: Sequence[str | Path],
    embedding: Sequence[str | Path],
    weights_sha256: str,
    staging: str | Path,
    segment_starts: Sequence[int] = (0,),
    vae_sha256: Mapping[str, str] | None = None,
    edit_files: Sequence[str | Path] = (),
    code: str = "",
    base_dir: str | Path = ".",
) -> list[dict[str, Any]]:
    """Generate several runs of one checkpoint, prompt and seed in one process: the model
    loaded (and compiled) once, then each run (each of its layer groups) as
    ``extract_job`` makes it alone, into its own folder with its own manifest.

    ``job``: ``ExtractionPlan.job_params`` (each run's params: ``extractplan.run_params``);
    ``outputs``: the folders, run by run and layer group by layer group. A run is made
    once for its inputs (its params, the prompt's embeddings, the head classes and orders
    its edits read, the weights, the code: its ``run_key``, which its manifest records): an
    output folder that verifies with the same key is kept. A run finished in the job waits
    in ``staging`` (a folder of the results folder, the outputs' paths below it) until
    every run is done, then all are moved into place; an interrupted job leaves its
    finished runs there, and the next attempt takes them (verified, same key) instead of
    generating them again. Returns the metadata of each run it made, with its ``timings``
    (``extract_job``'s, less the job's start and load)."""
    job_began = time.perf_counter()
    spec = CheckpointSpec(**job["checkpoint"])
    compute = job["compute"]
    files = [embedding] if isinstance(embedding, (str, Path)) else list(embedding)
    shared = {
        "prompt_id": prompt_id,
        "seed": int(seed),
        "segment_starts": [int(start) for start in segment_starts],
        "embeddings": [file_sha256(file) for file in files],
        # The head classes and head orders the runs' edits select heads by: other heads, other runs.
        "edit_files": [file_sha256(file) for file in edit_files],
        "weights_sha256": weights_sha256,
        "code": code,
    }
    units = _job_units(job, outputs, Path(staging), shared, dict(vae_sha256 or {}))
    todo, moved = [], []
    for unit in units:
        if _holds(unit.output, unit.key):
            log.info("%s: kept (made for the same inputs)", unit.output)
            shutil.rmtree(unit.staged, ignore_errors=True)
            _prune_empty(unit.staged.parent, Path(staging))
        elif _holds(unit.staged, unit.key):
            log.info("%s: taken from %s (finished by an earlier attempt)", unit.output, unit.staged)
            moved.append(unit)
        else:
            todo.append(unit)
    results: list[dict[str, Any]] = []
    if todo:
        runs = [resolved_edits(unit.options, unit.variant, edit_files) for unit in todo]
        device = pick_device(compute["device"])
        began = time.perf_counter()
        model, vae, dtype, _ = _load_model(spec, runs, device, compute, [u.capture for u in todo], base_dir, began)
        schedule, prompt, switches, context_meta = _prompt_schedule(files, segment_starts)
        for number, (unit, options) in enumerate(zip(todo, runs), 1):
            log.info("run %d of %d in this job: %s", number, len(todo), unit.output)
            run = _Run.of(
                model.config, spec, unit.variant, options, prompt_id, seed, prompt, switches, unit.layers, context_meta
            )
            metadata, timings = _generate(
                model,
                vae,
                dtype,
                device,
                run,
                schedule,
                unit.capture,
                compute,
                weights_sha256,
                unit.staged,
                contents={"run_key": unit.key},
            )
            results.append({**metadata, "timings": timings})
            moved.append(unit)
    for unit in moved:
        unit.output.parent.mkdir(parents=True, exist_ok=True)
        _swap_in(unit.staged, unit.output)
        _prune_empty(unit.staged.parent, Path(staging))
    log.info(
        "%d runs: %d made, %d kept or taken from staging, in %.1f s",
        len(units),
        len(todo),
        len(units) - len(todo),
        time.perf_counter() - job_began,
    )
    return results


@dataclasses.dataclass(frozen=True)
class _Unit:
    """One folder of a job of several runs: the run's variant, options, layers and
    capture, its output, its place in staging and its ``run_key``."""

    variant: str
    options: GenerationOptions
    layers: list[int]
    capture: Mapping[str, Any]
    output: Path
    staged: Path
    key: str


def _job_units(job, outputs, staging: Path, shared, vae_sha256) -> list[_Unit]:
    """The job's folders in the order of its outputs (run by run, group by group), each
    run's params as it would get them alone (``extractplan.run_params``)."""
    from sinkscope.pipeline.extractplan import run_params

    groups = [(index, layers) for index, run in enumerate(job["runs"]) for layers in run["groups"]]
    if len(groups) != len(outputs):
        raise SinkscopeError(f"the job's {len(groups)} run folders are given {len(outputs)} outputs")
    base = staging.parent
    units = []
    for (index, layers), output in zip(groups, outputs):
        output = Path(output)
        try:
            staged = staging / output.relative_to(base)
        except ValueError:
            raise SinkscopeError(f"output {output} is not in the results folder {base} of {staging}") from None
        params = run_params(job, index, layers)
        variant = params["variant"]
        source_vae = vae_sha256.get(variant, "")
        key = stable_hash({**shared, "params": params, "vae_sha256": source_vae})
        options = GenerationOptions.from_config(params["generation"])
        units.append(_Unit(variant, options, list(layers), params["capture"], output, staged, key))
    return units


def _prune_empty(folder: Path, root: Path) -> None:
    """Remove ``folder`` and its parents up to ``root`` (included) while they are empty."""
    while True:
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone
            return
        if folder == root:
            return
        folder = folder.parent


def _holds(folder: Path, key: str) -> bool:
    """Whether ``folder`` is a whole extraction folder made for ``key`` (its manifest's
    ``run_key``; its files against the manifest)."""
    if not (folder / MANIFEST).is_file():
        return False
    try:
        if read_manifest(folder)["contents"].get("run_key") != key:
            return False
    except DamagedFileError:
        return False
    return not check_directory(folder)


def resolved_edits(options: GenerationOptions, variant: str, edit_files: Sequence[str | Path]) -> GenerationOptions:
    """The options with the edits that select heads by class (``class:<label>``) or by a
    head atlas's order (``atlas:<sweep>:<order>:<k>``) turned into lists of heads, from the
    untouched default run's classes and the atlases' orders among ``edit_files``."""
    classes_needed, atlases = class_selections(options.interventions), atlas_selections(options.interventions)
    if not classes_needed and not atlases:
        return options
    head_classes, head_orders = read_selection_files(edit_files)
    edits = options.interventions
    if classes_needed:
        if head_classes is None:
            raise SinkscopeError(
                f"variant {variant!r} selects heads by class: its job needs the untouched default run's "
                "head classes (the workflow makes them first)"
            )
        edits = with_head_classes(edits, head_classes)
    if atlases:
        missing = [atlas for atlas in atlases if atlas not in head_orders]
        if missing:
            raise SinkscopeError(
                f"variant {variant!r} selects heads by the orders of head atlas {missing[0]!r}: its job needs "
                "that atlas's head orders (the workflow makes them first)"
            )
        edits = with_head_orders(edits, head_orders)
    return dataclasses.replace(options, interventions=edits)


def _load_model(spec, runs: Sequence[GenerationOptions], device, compute, captures, base_dir, began: float):
    """The model, with its kernels set and compiled where a run wants it, the VAE a run's
    generation runs (Krea's re-encode of a context frame; else None), its dtype (the one
    the workflow planned) and the seconds since ``began`` once the weights are loaded."""
    from sinkscope.attention.flash4 import resolved_attention_kernel
    from sinkscope.attention.settings import KernelSettings
    from sinkscope.generation.krea import load_reencode_vae
    from sinkscope.model.loading import load_checkpoint

    resolved = resolve_checkpoint(spec, base_dir)
    model = load_checkpoint(resolved, device=device)
    vae = next((v for v in (load_reencode_vae(resolved, o, device) for o in runs) if v is not None), None)
    loaded = time.perf_counter() - began
    log.info("%s loaded in %.2f s", spec.name, loaded)
    dtype = str(model.dtype).replace("torch.", "")
    if dtype != compute["dtype"]:
        raise SinkscopeError(f"checkpoint {spec.name!r} computes in {dtype}, the workflow planned {compute['dtype']}")
    model.kernels = KernelSettings.from_capture(captures[0])
    # capture.attention_kernel: flash4 where it can not run fails here, before the generation.
    resolved_attention_kernel(model.kernels.attention_kernel, device, model.dtype, model.config.head_dim)
    frames = sum(options.num_frames for options in runs)
    fused = model.kernels.fused_norms and dtype in ("float16", "bfloat16")
    if any(compile_wanted(capture.get("compile", "auto"), device, frames, fused) for capture in captures):
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

    def manifest_contents(self, counts, device, dtype, latents, capture, kernels, recorder) -> dict[str, Any]:
        """What the folder's manifest says it holds, with the video's sink collapse (per
        block, how like the sink frames and the previous block the latents are). ``kernels``:
        the model's ``KernelSettings``."""
        import torch

        from sinkscope.attention.flash4 import resolved_attention_kernel

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
                "kernels": kernels.name,
                # The attention kernel that ran (flash4, cudnn, or sdpa off CUDA / fp16 / bf16): the
                # two CUDA kernels round differently, so the video depends on it.
                "attention_kernel": resolved_attention_kernel(
                    kernels.attention_kernel, device, getattr(torch, dtype), self.config.head_dim
                ),
                "cuda_graphs": kernels.cuda_graphs,
                "video_exact": recorder.video_exact,
                # Whether some call's statistics came from the attention call's own pass
                # (exact or fused: FlashAttention-4 with every frame's partials; the same
                # statistics to float32 rounding as the pass after the call).
                "one_pass": recorder.one_pass_calls > 0,
            },
        }
