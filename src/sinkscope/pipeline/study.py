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

from sinkscope.errors import ConfigError, gathered
from sinkscope.naming import parse_head_label
from sinkscope.pipeline.config import check_config
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.figureplan import SUMMARY_FIGURES, FigurePlan
from sinkscope.pipeline.layout import (
    ATLAS_TABLES,
    DEFAULT_VARIANT,
    EFFECT_TABLES,
    PATTERNS,
    RESULTS,
    SOURCE_TABLES,
    TABLES,
    VARIANT_SEPARATOR,
    path,
)
from sinkscope.pipeline.machinecheck import check_machine, device_problems
from sinkscope.pipeline.videoplan import video_targets
from sinkscope.schema import schema_defaults

__all__ = [
    "ATLAS_TABLES",
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
    from sinkscope.pipeline.resources import resolve_device

    checked = check_config(config, base_dir)
    normalized, resolved, problems = checked.config, checked.resolved, list(checked.problems)
    device = None
    if "device" not in checked.invalid:
        with gathered(problems):
            device = resolve_device(normalized["device"], local=local and check_this_machine)
    if device is not None and check_this_machine and "capture" not in checked.invalid:
        problems += device_problems(normalized, device, local=local)
    if device is not None and check_this_machine and checked.complete and not problems:
        with gathered(problems):
            check_machine(normalized, resolved, local=local)
    study = Study(normalized, str(base_dir), device=device or "cpu", checkpoints=resolved)
    for name, checkpoint in resolved.items():
        try:  # every text encoder now, not while rules are built
            checkpoint.text_encoder()
        except (FileNotFoundError, ValueError) as error:
            problems.append(f"config key checkpoints.{name}: {error}")
    whole = not {"layers", "checkpoints", "legacy_caches"} & checked.invalid and len(resolved) == len(
        normalized["checkpoints"]
    )
    captured = _captured_layers(study, base_dir, problems) if whole else None
    if captured is not None and "figures" not in checked.invalid:
        chosen = normalized["figures"]["heads"] != schema_defaults("figures")["heads"]
        problems += _uncaptured_figure_layers(study, captured, chosen_heads=chosen)
    if problems:
        raise ConfigError.invalid(problems)
    study.encoders  # noqa: B018 - resolved above, kept for the rules
    return study


def _captured_layers(study: Study, base_dir: str | Path, problems: list[str]) -> set[int] | None:
    """The layers the study captures: the checkpoints' ``layers`` and every legacy cache's
    own, each cache read now for what its import would refuse (into ``problems``); None
    when a cache cannot be read (its missing file is named by the config check)."""
    captured = set(study.layers) if study.checkpoints else set()
    known = True
    for source, entry in study.legacy.items():
        file = Path(entry["path"]) if Path(entry["path"]).is_absolute() else Path(base_dir) / entry["path"]
        if not file.is_file():
            known = False
            continue
        try:
            captured.update(study.source_layers(source))
        except ConfigError as error:
            problems += error.problems
            known = False
    return captured if known else None


def _uncaptured_figure_layers(study: Study, captured: set[int], *, chosen_heads: bool) -> list[str]:
    """The layers figures draw that the study does not capture: figures.highlight_layers,
    and the heads of figures.heads when they are not the default pair (``chosen_heads``:
    Deep Forcing's L1H1 and L5H10, drawn where their layer is captured, their panels saying
    when it is not, as in ``layers=[0,1]`` over config.yaml). A layer no checkpoint's model
    has is named by the config check already."""
    deepest = min((c.model_config.num_layers for c in study.checkpoints.values()), default=None)
    figures = study.config["figures"]
    problems = []
    missing = [
        layer
        for layer in figures["highlight_layers"] or []
        if layer not in captured and (deepest is None or layer < deepest)
    ]
    if missing:
        problems.append(
            f"config key figures.highlight_layers: {missing} are not captured (layers: "
            f"{sorted(captured)}); highlight layers from that list, or add them to layers"
        )
    for label in figures["heads"] if chosen_heads else []:
        layer = parse_head_label(label)[0]
        if layer not in captured and (deepest is None or layer < deepest):
            problems.append(
                f"config key figures.heads: {label!r} is in layer {layer} (0-based), which the study does not "
                f"capture (layers: {sorted(captured)}); choose heads of those layers, or add {layer} to layers"
            )
    return problems


class Study(FigurePlan):
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
            + self.atlas_targets()
            + self.head_orders_targets()
            + per_source
            + inputs
            + self.all_embeddings()
            + self.class_targets()
            + self.figure_targets()
            + [self.path("summary")]
            + video_targets(self)
        )
