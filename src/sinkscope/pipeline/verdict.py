"""What ``sinkscope check`` says of a study it accepts: one line, built from parts.

Each part is a function of the study that returns a few words (or None: nothing to
say); ``VERDICT_PARTS`` lists them in order, so a new kind of study (a sweep: how many
runs it holds, their GPU time) adds one function to the list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sinkscope.naming import encode_layers
from sinkscope.pipeline.durations import DECODE_JOB_SECONDS, OTHER_JOB_SECONDS, describe_seconds, extraction_seconds
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
    return {
        "extraction": len(study.all_extract_dirs()),
        "import": len(study.legacy),
        "prompt": len(embeddings),
        # Per source its tables, then the combined tables and the summary page.
        "table": len(study.sources) + 2,
        "figure": figure_jobs(study) + (len(videos) - decodes) // 2,
        "effects": (len(study.checkpoints) + 1) if study.effect_variants else 0,
        "head classes": len(study.class_checkpoints),
        "decode": decodes,
    }


def figure_jobs(study: Study) -> int:
    """The figure jobs, one a source (its own figures; its layers' figures), a checkpoint
    and the study, as rules/figures.smk plans them (``pipeline.figureplan``)."""
    sources = sum(bool(study.figure_kinds(s)) for s in study.sources)
    layers = sum(bool(study.layer_figure_kinds(s) and study.source_layers(s)) for s in study.sources)
    checkpoints = sum(bool(study.checkpoint_figure_kinds(c)) for c in study.checkpoints)
    return sources + layers + checkpoints + bool(study.study_figure_kinds())


def study_seconds(study: Study) -> float:
    """Seconds of every job of the study one after another on its device (an estimate:
    ``pipeline.durations``)."""
    counts = job_counts(study)
    seconds = 0.0
    for source, (checkpoint, _) in study.runs.items():
        resolved = study.checkpoints[checkpoint]
        weight_bytes = sum(file.stat().st_size for file in resolved.weight_files())
        options = study.options[source]
        for prompt in study.prompts:
            switches = study.switches.get(prompt, [])
            for group in study.layer_groups:
                job = extraction_seconds(
                    resolved.model_config,
                    options,
                    study.device,
                    captured_layers=len(group),
                    weight_bytes=weight_bytes,
                    switch_frames=switches,
                )
                seconds += job * len(study.seeds)
    others = sum(count for kind, count in counts.items() if kind not in ("extraction", "decode"))
    return seconds + others * OTHER_JOB_SECONDS + counts["decode"] * DECODE_JOB_SECONDS


def runs_part(study: Study) -> str:
    """How many generations: checkpoints x variants x prompts x seeds (and imported caches)."""
    checkpoints, variants = len(study.checkpoints), len(study.variants)
    runs = checkpoints * variants * len(study.prompts) * len(study.seeds)
    configured = study.config.get("variants") or {}
    added = [name for name in study.variants if name not in configured]
    variant_words = _plural(variants, "variant") + (
        f" ({', '.join(added)} added: the untouched run)" if added and configured else ""
    )
    text = (
        f"{_plural(runs, 'run')} ({_plural(checkpoints, 'checkpoint')} x {variant_words} x "
        f"{_plural(len(study.prompts), 'prompt')} x {_plural(len(study.seeds), 'seed')})"
    )
    if study.legacy:
        text += f" and {_plural(len(study.legacy), 'imported cache')}"
    return text


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


VERDICT_PARTS: list[Callable[[Study], str | None]] = [runs_part, jobs_part, device_part, time_part]


def verdict(study: Study, name: str) -> str:
    """The one line ``sinkscope check`` prints for a study it accepts (``name``: its file)."""
    parts = [text for part in VERDICT_PARTS if (text := part(study))]
    return f"{name}: valid: " + "; ".join(parts)
