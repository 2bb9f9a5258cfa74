"""What the Snakefile needs from a config: the one check (``load_study``) and the study
it plans (``Study``): paths, job groups, canonical rule params.

``Study`` is composed of the stage planners, each short and in its own module: the grid
of sources, runs and layer groups (``pipeline.grid``), extraction (``pipeline.extractplan``),
interventions and their effects (``pipeline.effectsplan``), figures
(``pipeline.figureplan``) and videos (``pipeline.videoplan``). The file tree under the
results folder is defined once, in ``pipeline.layout``; the rules spell the same
patterns out. Nothing here imports torch or pandas: the Snakefile parses in well under a
second of sinkscope's own time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.pipeline.config import check_machine, checked_config
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.effectsplan import EffectsPlan
from sinkscope.pipeline.figureplan import SUMMARY_FIGURES, FigurePlan
from sinkscope.pipeline.layout import (
    DEFAULT_VARIANT,
    EFFECT_TABLES,
    PATTERNS,
    RESULTS,
    SOURCE_TABLES,
    TABLES,
    VARIANT_SEPARATOR,
    path,
)
from sinkscope.pipeline.videoplan import video_targets

__all__ = [
    "DEFAULT_VARIANT",
    "EFFECT_TABLES",
    "PATTERNS",
    "RESULTS",
    "SOURCE_TABLES",
    "SUMMARY_FIGURES",
    "TABLES",
    "VARIANT_SEPARATOR",
    "Study",
    "load_study",
    "path",
]


def load_study(
    config: Mapping[str, Any] | None,
    base_dir: str | Path = ".",
    *,
    local: bool = True,
    check_this_machine: bool = True,
    config_files: Sequence[str | Path] = (),
) -> Study:
    """The one check of a study: what the Snakefile, ``sinkscope check`` and every command
    run before any job, so they refuse the same configs.

    ``config`` is the raw config (Snakemake's ``config``, or a file's mapping plus
    overrides); ``config_files`` are re-read for what YAML silently accepts (a key given
    twice). It is coerced, defaulted and validated against the schema; names, numbers
    and ranges are checked; every checkpoint is resolved once (weight, adapter and
    text-encoder files found and opened far enough to know they are whole), legacy
    caches are read far enough to know their layers; and, with ``check_this_machine``,
    the device must exist and every job must fit its memory (``local=False``: jobs run
    elsewhere, only the explicit limits apply). Raises ConfigError naming every problem.
    """
    for file in config_files:
        read_config_file(file)
    normalized, resolved = checked_config(config, base_dir)
    from sinkscope.pipeline.resources import resolve_device

    device = (
        check_machine(normalized, resolved, local=local)
        if check_this_machine
        else resolve_device(normalized["device"], local=False)
    )
    study = Study(normalized, str(base_dir), device=device, checkpoints=resolved)
    study.encoders  # noqa: B018 - resolves every text encoder now, not while rules are built
    captured = set(study.layers) if study.checkpoints else set()
    for source in study.legacy:
        captured.update(study.source_layers(source))
    highlighted = normalized["figures"]["highlight_layers"] or []
    missing = [layer for layer in highlighted if layer not in captured]
    if missing:
        raise ConfigError.invalid(
            [
                f"config key figures.highlight_layers: {missing} are not captured (layers: "
                f"{sorted(captured)}); highlight layers from that list, or add them to layers"
            ]
        )
    return study


class Study(EffectsPlan, FigurePlan):
    """A normalized config seen as a grid of jobs and files: the stage planners composed."""

    def all_targets(self) -> list[str]:
        """Everything the study makes, intermediate results included: Snakemake does not
        rebuild a missing intermediate whose consumers are up to date, and a result
        moved aside as damaged must come back on the next run."""
        tables = [self.path("table", table=t) for t in (*TABLES, "token_profiles")]
        per_source = [p for source in self.sources for p in self.source_tables(source).values()]
        per_source += [self.path("head_classes_csv", source=source) for source in self.sources]
        inputs = self.all_extract_dirs() + [self.path("imported", source=name) for name in self.legacy]
        return (
            tables
            + self.effects_targets()
            + per_source
            + inputs
            + self.all_embeddings()
            + self.class_targets()
            + self.figure_targets()
            + [self.path("summary")]
            + video_targets(self)
        )
