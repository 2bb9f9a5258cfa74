"""The figures' plan: which kinds each source, layer, checkpoint and the study get, the
tables each reads, the options each draws with, and what the summary page shows
(rules/figures.smk, rules/report.smk; the kinds: ``sinkscope.figures.registry``).

Each figure job gets only the options its kind draws with and the digest of its own
drawing code, so changing a figure option, or a figure's code, reruns only those
figures. Torch-free: the Snakefile calls it while it parses.
"""

from __future__ import annotations

from typing import Any

from sinkscope.figures.registry import (
    CHECKPOINT_FIGURES,
    COMMON_OPTIONS,
    DRAWING_OPTIONS,
    FIGURES,
    LABEL_FIGURES,
    LAYER_FIGURES,
    SOURCE_FIGURES,
    STUDY_FIGURES,
    SWITCH_FIGURES,
    TOKEN_FIGURES,
)
from sinkscope.naming import parse_head_label
from sinkscope.pipeline.extractplan import ExtractionPlan
from sinkscope.pipeline.layout import EFFECT_TABLES

# The figures the summary page embeds beside its tables.
SUMMARY_FIGURES = (
    "figure4",
    "sink_score_overview",
    "head_classes",
    "first_middle_last",
    "sink_mass_over_time",
    "policy_comparison",
    "variant_drift",
    "attention_shift",
    "cache_timeline",
)
EXTENSIONS = ("svg", "png")


class FigurePlan(ExtractionPlan):
    """The figures of a study: kinds, inputs, options, targets."""

    # -- which kinds ---------------------------------------------------------------------------------

    def figure_kinds(self, source: str) -> list[str]:
        """Source figures to draw: token figures only with token profiles of a chosen head's layer."""
        kinds = list(SOURCE_FIGURES)
        head_layers = {parse_head_label(label)[0] for label in self.config["figures"]["heads"]}
        if not self.token_profiles(source) or not head_layers & set(self.source_layers(source)):
            kinds = [kind for kind in kinds if kind not in TOKEN_FIGURES]
        if not self.config["diagnostics"].get("reference_labels"):
            kinds = [kind for kind in kinds if kind not in LABEL_FIGURES]
        return kinds

    def checkpoint_figure_kinds(self, checkpoint: str) -> list[str]:
        """Checkpoint figures to draw: those that compare variants only with two or more,
        the prompt-switch figures only when a prompt switches."""
        several = len(self.sources_of(checkpoint)) >= 2
        return [
            kind
            for kind in CHECKPOINT_FIGURES
            if (FIGURES[kind].compares != "variants" or several)
            and (kind not in SWITCH_FIGURES or self.switches)
            and (self.effect_variants or not set(FIGURES[kind].inputs) & set(EFFECT_TABLES))
        ]

    def study_figure_kinds(self) -> list[str]:
        """Study figures to draw: those that compare checkpoints only with two or more (the
        checkpoints and imported caches of the combined tables)."""
        several = len(self.checkpoints) + len(self.legacy) >= 2
        return [kind for kind in STUDY_FIGURES if FIGURES[kind].compares != "checkpoints" or several]

    # -- what each reads ------------------------------------------------------------------------------

    def figure_inputs(self, kind: str, source: str) -> list[str]:
        """The tables figure ``kind`` of ``source`` reads (a checkpoint's: all its variants)."""
        sources = self.sources_of(source) if kind in CHECKPOINT_FIGURES else [source]
        tables = [
            self.path("source_table", source=s, table=t)
            for s in sources
            for t in FIGURES[kind].inputs
            if t not in EFFECT_TABLES
        ]
        tables += [
            self.path("effects_table", checkpoint=source, table=t) for t in FIGURES[kind].inputs if t in EFFECT_TABLES
        ]
        if FIGURES[kind].needs_reference_labels:
            tables.append(str(self.config["diagnostics"]["reference_labels"]))
        return tables

    def layer_figure_inputs(self, kind: str, source: str, layer: int) -> list[str]:
        """The frame rows of one layer (extraction folders, or the imported file) and the
        source tables the kind also reads (head classes)."""
        tables = [self.path("source_table", source=source, table=t) for t in FIGURES[kind].uses]
        return self.source_inputs(source, layer) + tables

    def study_figure_inputs(self, kind: str) -> list[str]:
        return [self.path("table", table=t) for t in FIGURES[kind].inputs]

    def figure_options(self, kind: str, source: str | None = None) -> dict[str, Any]:
        """Only the options figure ``kind`` draws with (the registry says which): changing
        another reruns nothing. ``summary`` is the report page. A kind that draws with
        ``generation`` gets ``source``'s resolved generation options."""
        options = self.config["figures"]
        chosen: dict[str, Any] = {name: options[name] for name in COMMON_OPTIONS}
        if kind == "summary":
            return {**chosen, **self._summary_options()}
        drawn = FIGURES[kind].options
        chosen.update((name, options[name]) for name in DRAWING_OPTIONS if name in drawn)
        if "heads" in chosen:
            chosen["heads"] = list(chosen["heads"])
        if "generation" in FIGURES[kind].extra_options and source in self.options:
            chosen["generation"] = self.options[source].to_dict()
        return chosen

    def _summary_options(self) -> dict[str, Any]:
        """What the summary page draws with: the call and metric, each model, the thresholds
        and the figures beside its tables."""
        options = self.config["figures"]
        return {
            "step": options["step"],
            "metric": options["metric"],
            "checkpoints": {
                name: {"format": c.format, "weights": c.spec.weights, "model": c.spec.model}
                for name, c in self.checkpoints.items()
            },
            "legacy_caches": {name: {"path": str(entry["path"])} for name, entry in self.legacy.items()},
            "diagnostics": dict(self.config["diagnostics"]),
            "figures": self.summary_figures(),
        }

    # -- targets ----------------------------------------------------------------------------------

    def _drawn(self, name: str, **wildcards: Any) -> list[str]:
        return [self.path(name, ext=ext, **wildcards) for ext in EXTENSIONS]

    def figure_targets(self) -> list[str]:
        paths = []
        for source in self.sources:
            for kind in self.figure_kinds(source):
                paths += self._drawn("source_figure", source=source, kind=kind)
            for layer in self.source_layers(source):
                for kind in LAYER_FIGURES:
                    paths += self._drawn("layer_figure", source=source, layer=layer, kind=kind)
        for checkpoint in self.checkpoints:
            for kind in self.checkpoint_figure_kinds(checkpoint):
                paths += self._drawn("checkpoint_figure", checkpoint=checkpoint, kind=kind)
        for kind in self.study_figure_kinds():
            paths += self._drawn("study_figure", kind=kind)
        return paths

    def summary_figures(self) -> dict[str, dict[str, str]]:
        """The figures the summary page shows beside its tables: per source, its overview
        figures (SVG); per checkpoint, its block-by-block sink mass."""
        shown = [kind for kind in SUMMARY_FIGURES if kind in SOURCE_FIGURES]
        figures = {
            source: {
                kind: self.path("source_figure", source=source, kind=kind, ext="svg")
                for kind in shown
                if kind in self.figure_kinds(source)
            }
            for source in self.sources
        }
        for checkpoint in self.checkpoints:
            for kind in self.checkpoint_figure_kinds(checkpoint):
                if kind in SUMMARY_FIGURES:
                    figures.setdefault(checkpoint, {})[kind] = self.path(
                        "checkpoint_figure", checkpoint=checkpoint, kind=kind, ext="svg"
                    )
        return figures

    def summary_figure_paths(self) -> list[str]:
        return [p for figures in self.summary_figures().values() for p in figures.values()]
