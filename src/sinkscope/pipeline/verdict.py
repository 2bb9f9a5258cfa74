"""What ``sinkscope check`` says of a study it accepts: one line, built from parts.

Each part is a function of the study that returns a few words (or None: nothing to
say); ``VERDICT_PARTS`` lists them in order, so a new kind of study (a sweep: how many
runs it holds, their GPU time) adds one function to the list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sinkscope.naming import encode_layers
from sinkscope.pipeline.durations import (
    DECODE_JOB_SECONDS,
    OTHER_JOB_SECONDS,
    describe_seconds,
    generation_seconds,
    job_start_seconds,
)
from sinkscope.pipeline.resources import default_dtype

if TYPE_CHECKING:
    from sinkscope.pipeline.study import Study


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def job_counts(study: Study) -> dict[str, int]:
    """Jobs of the whole study by what they do, as the rules make them (nothing done yet)."""
    from sinkscope.pipeline.videoplan import video_targets

    embeddings = {
        file
        for checkpoint in study.checkpoints
        for prompt in study.prompts
        for file in study.embeddings(checkpoint, prompt)
    }
    videos = video_targets(study)
    decodes = sum(target.endswith(".mp4") for target in videos)
    runs = len(study.prompts) * len(study.seeds)
    single = sum(len(study.run_groups(source)) for source in study.single_runs) * runs
    return {
        # One job a folder of a run alone, one a prompt and seed for each job of several runs.
        "extraction": single + len(study.extraction_jobs) * runs,
        "import": len(study.legacy),
        "prompt": len(embeddings),
        # Per source its tables, then the combined tables and the summary page.
        "table": len(study.sources) + 2,
        # One job draws every figure of a source (its layer figures another), of a
        # checkpoint, of the study; a contact sheet is a job of its own.
        "figure": figure_jobs(study) + (len(videos) - decodes) // 2,
        "effects": (len(study.checkpoints) + 1) if study.has_effects else 0,
        "head classes": len(study.class_targets()),
        # Per checkpoint its atlas tables, then the combined ones; each ranked atlas's head orders.
        "atlas": ((len(study.checkpoints) + 1) if study.has_atlas else 0) + len(study.ranked_atlases),
        "decode": decodes,
    }


def figure_jobs(study: Study) -> int:
    """The figure jobs, one a source (its own figures; its layers' figures), a checkpoint
    and the study, as rules/figures.smk plans them (``pipeline.figureplan``)."""
    sources = sum(bool(study.figure_kinds(s)) for s in study.sources)
    layers = sum(bool(study.layer_figure_kinds(s) and study.source_layers(s)) for s in study.sources)
    checkpoints = sum(bool(study.checkpoint_figure_kinds(c)) for c in study.checkpoints)
    return sources + layers + checkpoints + bool(study.study_figure_kinds())


def _extraction_seconds(study: Study) -> tuple[float, float]:
    """Seconds of every extraction job of the study one after another on its device, and
    of those the atlas runs' generations (an estimate: ``pipeline.durations``)."""
    weights: dict[str, int] = {}

    def weight_bytes(checkpoint: str) -> int:
        if checkpoint not in weights:
            weights[checkpoint] = sum(file.stat().st_size for file in study.checkpoints[checkpoint].weight_files())
        return weights[checkpoint]

    def generations(source: str, prompt: str) -> float:
        config = study.model_config(study.checkpoint_of(source))
        switches = study.switches.get(prompt, [])
        return sum(
            generation_seconds(
                config, study.options[source], study.device, captured_layers=len(group), switch_frames=switches
            )
            for group in study.run_groups(source)
        )

    total = atlas = 0.0
    seeds = len(study.seeds)
    for prompt in study.prompts:
        for source in study.single_runs:
            start = job_start_seconds(study.device, weight_bytes=weight_bytes(study.checkpoint_of(source)))
            seconds = generations(source, prompt)
            total += seeds * (seconds + start * len(study.run_groups(source)))
            atlas += seeds * seconds if study.is_atlas_run(source) else 0.0
        for job in study.extraction_jobs:
            start = job_start_seconds(study.device, weight_bytes=weight_bytes(job.checkpoint))
            seconds = {source: generations(source, prompt) for source in job.sources}
            total += seeds * (start + sum(seconds.values()))
            atlas += seeds * sum(s for source, s in seconds.items() if study.is_atlas_run(source))
    return total, atlas


def study_seconds(study: Study) -> float:
    """Seconds of every job of the study one after another on its device (an estimate:
    ``pipeline.durations``)."""
    counts = job_counts(study)
    others = sum(count for kind, count in counts.items() if kind not in ("extraction", "decode"))
    return _extraction_seconds(study)[0] + others * OTHER_JOB_SECONDS + counts["decode"] * DECODE_JOB_SECONDS


def runs_part(study: Study) -> str:
    """How many generations: checkpoints x variants x prompts x seeds (and imported caches)."""
    checkpoints, variants = len(study.checkpoints), len(study.variants)
    runs = sum(len(study.variants_of(c)) for c in study.checkpoints) * len(study.prompts) * len(study.seeds)
    configured = study.config.get("variants") or {}
    added = [name for name in study.variants if name not in configured]
    variant_words = _plural(variants, "variant") + (
        f" ({', '.join(added)} added: the untouched run)" if added and configured else ""
    )
    atlas = sorted({len(study.atlas_variants(c)) for c in study.checkpoints})
    if atlas and atlas[-1]:
        count = f"{atlas[0]}" if len(atlas) == 1 else f"{atlas[0]}-{atlas[-1]}"
        variant_words = f"({variant_words} + {count} atlas run{'' if atlas == [1] else 's'})"
    text = (
        f"{_plural(runs, 'run')} ({_plural(checkpoints, 'checkpoint')} x {variant_words} x "
        f"{_plural(len(study.prompts), 'prompt')} x {_plural(len(study.seeds), 'seed')})"
    )
    if study.legacy:
        text += f" and {_plural(len(study.legacy), 'imported cache')}"
    return text


def sweeps_part(study: Study) -> str | None:
    """The sweeps' runs for one checkpoint, prompt and seed, and their generations' time."""
    if not study.sweeps or not study.checkpoints:
        return None
    swept = study.swept(next(iter(study.checkpoints)))
    counts = {name: sum(v.startswith(f"{name}/") for v in swept) for name in study.sweeps}
    listed = ", ".join(f"{name} {count}" for name, count in counts.items())
    seconds = _extraction_seconds(study)[1]
    return (
        f"sweeps: {_plural(len(swept), 'run')} a prompt and seed ({listed}), "
        f"about {describe_seconds(seconds)} of {study.device} generating atlas runs"
    )


def jobs_part(study: Study) -> str:
    """How many jobs, the extractions among them, and the layers each captures."""
    counts = job_counts(study)
    layers = study.layers
    text = f"{_plural(sum(counts.values()), 'job')}"
    if counts["extraction"]:
        per_job = {len(group) for group in study.layer_groups}
        each = f"{'/'.join(map(str, sorted(per_job)))} layer{'' if per_job == {1} else 's'}"
        text += (
            f", {counts['extraction']} of them extractions of {each} each "
            f"(layers {encode_layers(layers).replace('_', ', ')}: {_plural(len(layers), 'layer')})"
        )
    if study.extraction_jobs:
        several = len(study.extraction_jobs) * len(study.prompts) * len(study.seeds)
        text += f", {several} of these of several runs (up to {study.runs_per_job} a job, the model loaded once)"
    return text


def device_part(study: Study) -> str | None:
    """Where the extraction jobs compute, and in which precision."""
    if not study.checkpoints:
        return None
    dtypes = sorted({default_dtype(study.device, checkpoint.spec.dtype) for checkpoint in study.checkpoints.values()})
    return f"extractions on {study.device} ({', '.join(dtypes)})"


def time_part(study: Study) -> str:
    """The time of the whole study here, one job at a time (an estimate)."""
    return f"about {describe_seconds(study_seconds(study))} one job at a time (an estimate from the study's size)"


VERDICT_PARTS: list[Callable[[Study], str | None]] = [runs_part, sweeps_part, jobs_part, device_part, time_part]


def verdict(study: Study, name: str) -> str:
    """The one line ``sinkscope check`` prints for a study it accepts (``name``: its file)."""
    parts = [text for part in VERDICT_PARTS if (text := part(study))]
    return f"{name}: valid: " + "; ".join(parts)
