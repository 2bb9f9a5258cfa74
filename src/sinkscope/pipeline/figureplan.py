"""The figures' plan: which kinds each source, layer, checkpoint and the study get, the
tables each reads, the options each draws with, and what the summary page shows
(rules/figures.smk, rules/report.smk; the kinds: ``sinkscope.figures.registry``).

One job draws every figure of a source (or of a layer of a source, of a checkpoint, of the
study) in one process: matplotlib and the tables are loaded once, not once a figure. The
sources whose figures are the same kinds share a rule (``source_figure_sets``,
``layer_figure_sets``): the runs, the variants paired with an untouched run
(``figures.variant_kinds``: fewer kinds by default) and imported caches. A job gets, per kind, only the options that
kind draws with and the digest of that kind's drawing code, so changing a figure option or
a figure's code reruns only the jobs that draw it. ``figures.kinds`` chooses the kinds.
Torch-free: the Snakefile calls it while it parses.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    SWEEP_FIGURES,
    SWITCH_FIGURES,
    TOKEN_FIGURES,
)
from sinkscope.naming import parse_head_label
from sinkscope.pipeline.effectsplan import EffectsPlan
from sinkscope.pipeline.layout import ATLAS_TABLES, EFFECT_TABLES
from sinkscope.sweeps import sweep_item

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
    "head_atlas",
    "frame_atlas",
    "pruning_curve",
)
EXTENSIONS = ("svg", "png")
# The kinds ``figures.kinds`` may choose (the contact sheet is outputs.contact_sheet's).
CHOOSABLE_FIGURES = (*SOURCE_FIGURES, *LAYER_FIGURES, *CHECKPOINT_FIGURES, *SWEEP_FIGURES, *STUDY_FIGURES)


@dataclass(frozen=True)
class FigureSet:
    """Sources whose figures are the same kinds (of the same layers), drawn by one rule
    (``<name>_figures``), one job a source."""

    name: str
    sources: tuple[str, ...]
    kinds: tuple[str, ...]
    layers: tuple[int, ...] = ()


class FigurePlan(EffectsPlan):
    """The figures of a study: kinds, inputs, options, targets."""

    # -- which kinds ---------------------------------------------------------------------------------

    def chosen_kinds(self, scope_kinds: tuple[str, ...]) -> list[str]:
        """The kinds of ``scope_kinds`` that ``figures.kinds`` chooses ('all': every one)."""
        chosen = self.config["figures"].get("kinds", "all")
        return [kind for kind in scope_kinds if chosen == "all" or kind in chosen]

    def is_paired_variant(self, source: str) -> bool:
        """Whether ``source`` is a variant compared with the untouched run of its checkpoint
        (``effect_variants``: the study has ``default`` beside it)."""
        return source in self.runs and self.runs[source][1] in self.effect_variants

    def _for_variant(self, source: str, kinds: list[str]) -> list[str]:
        """A paired variant's kinds: only those ``figures.variant_kinds`` lists."""
        if not self.is_paired_variant(source):
            return kinds
        listed = self.config["figures"]["variant_kinds"]
        return [kind for kind in kinds if kind in listed]

    def figure_kinds(self, source: str) -> list[str]:
        """Source figures to draw: the chosen ones (a paired variant's: fewer); token figures
        only with token profiles of a chosen head's layer; label_agreement with a label file."""
        kinds = self._for_variant(source, self.chosen_kinds(SOURCE_FIGURES))
        head_layers = {parse_head_label(label)[0] for label in self.config["figures"]["heads"]}
        if not self.token_profiles(source) or not head_layers & set(self.source_layers(source)):
            kinds = [kind for kind in kinds if kind not in TOKEN_FIGURES]
        if not self.config["diagnostics"].get("reference_labels"):
            kinds = [kind for kind in kinds if kind not in LABEL_FIGURES]
        return kinds

    def layer_figure_kinds(self, source: str) -> list[str]:
        """Layer figures to draw for each of the source's layers (a paired variant's: fewer)."""
        return self._for_variant(source, self.chosen_kinds(LAYER_FIGURES))

    def checkpoint_figure_kinds(self, checkpoint: str | None = None) -> list[str]:
        """Checkpoint figures to draw (every checkpoint has the same variants and sweeps):
        those that compare variants only with two or more, the prompt-switch figures only
        when a prompt switches, the effects figures only with variants paired with the
        untouched run; then the atlases (scope ``sweep``) of the axes the study sweeps."""
        several = len(self.variants) >= 2
        kinds = [
            kind
            for kind in self.chosen_kinds(CHECKPOINT_FIGURES)
            if (FIGURES[kind].compares != "variants" or several)
            and (kind not in SWITCH_FIGURES or self.switches)
            and (self.effect_variants or not set(FIGURES[kind].inputs) & set(EFFECT_TABLES))
        ]
        axes = self.atlas_axes
        return kinds + [kind for kind in self.chosen_kinds(SWEEP_FIGURES) if set(FIGURES[kind].sweep_axes) & axes]

    @property
    def atlas_axes(self) -> set[str]:
        """What the study's atlas runs run over (``sinkscope.sweeps``: head, layer, frame,
        ranked): its sweeps' axes and those its ``<sweep>/<item>`` variants name."""
        if not self.has_atlas:
            return set()
        axes = {sweep.axis for sweep in self.sweeps.values()}
        return axes | {item.axis for v in self.variants_of(next(iter(self.checkpoints))) if (item := sweep_item(v))}

    def study_figure_kinds(self) -> list[str]:
        """Study figures to draw: those that compare checkpoints only with two or more (the
        checkpoints and imported caches of the combined tables)."""
        several = len(self.checkpoints) + len(self.legacy) >= 2
        return [kind for kind in self.chosen_kinds(STUDY_FIGURES) if FIGURES[kind].compares != "checkpoints" or several]

    # -- which jobs: one a source (a layer, a checkpoint, the study), one rule a set of sources ------

    def _source_classes(self) -> dict[str, list[str]]:
        """The study's runs (untouched, or variants of a study without one), the variants
        paired with an untouched run, and imported caches (atlas runs have no figures)."""
        runs = [source for source in self.runs if not self.is_atlas_run(source)]
        return {
            "run": [s for s in runs if not self.is_paired_variant(s)],
            "variant": [s for s in runs if self.is_paired_variant(s)],
            "imported": list(self.legacy),
        }

    def source_figure_sets(self) -> list[FigureSet]:
        """The sets of sources drawn by one rule each (``run``, ``variant``, ``imported``);
        none empty."""
        sets = []
        for name, sources in self._source_classes().items():
            kinds = {tuple(self.figure_kinds(source)) for source in sources}
            if len(kinds) > 1:  # a planning bug: one rule's outputs are the same kinds for every source
                raise AssertionError(f"{name} sources differ in their figure kinds: {sorted(kinds)}")
            if kinds and next(iter(kinds)):
                sets.append(FigureSet(name, tuple(sources), next(iter(kinds))))
        return sets

    def layer_figure_sets(self) -> list[FigureSet]:
        """The sets of sources whose layer figures (every layer's, one job a source) are drawn
        by one rule each: ``layer`` (the runs), ``variant_layer``, ``imported_layer`` (imported
        caches whose layers differ: one set, ``imported_layer_2`` ..., per list of layers)."""
        sets = []
        for name, sources in self._source_classes().items():
            groups: dict[tuple, list[str]] = {}
            for source in sources:
                key = (tuple(self.layer_figure_kinds(source)), tuple(self.source_layers(source)))
                groups.setdefault(key, []).append(source)
            prefix = "layer" if name == "run" else f"{name}_layer"
            for i, ((kinds, layers), members) in enumerate(sorted(groups.items())):
                if kinds and layers:
                    sets.append(FigureSet(prefix + (f"_{i + 1}" if i else ""), tuple(members), kinds, layers))
        return sets

    # -- what each reads ------------------------------------------------------------------------------

    def figure_inputs(self, kind: str, source: str) -> list[str]:
        """The tables figure ``kind`` of ``source`` reads (a checkpoint's: all its variants)."""
        sources = self.sources_of(source) if kind in CHECKPOINT_FIGURES else [source]
        per_checkpoint = (*EFFECT_TABLES, *ATLAS_TABLES)
        tables = [
            self.path("source_table", source=s, table=t)
            for s in sources
            for t in FIGURES[kind].inputs
            if t not in per_checkpoint
        ]
        tables += [
            self.path("effects_table", checkpoint=source, table=t) for t in FIGURES[kind].inputs if t in per_checkpoint
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

    def source_figures(self, source: str) -> dict[str, dict[str, Any]]:
        """Every figure one job draws of a source: name (its kind) -> kind, inputs, options."""
        return {
            kind: self._figure(kind, self.figure_inputs(kind, source), source) for kind in self.figure_kinds(source)
        }

    def layer_figures(self, source: str) -> dict[str, dict[str, Any]]:
        """Every layer figure one job draws of a source: ``layer<L>_<kind>`` -> kind, layer,
        inputs, options."""
        return {
            f"layer{layer}_{kind}": self._figure(kind, self.layer_figure_inputs(kind, source, layer), source, layer)
            for layer in self.source_layers(source)
            for kind in self.layer_figure_kinds(source)
        }

    def checkpoint_figures(self, checkpoint: str) -> dict[str, dict[str, Any]]:
        return {
            kind: self._figure(kind, self.figure_inputs(kind, checkpoint)) for kind in self.checkpoint_figure_kinds()
        }

    def study_figures(self) -> dict[str, dict[str, Any]]:
        return {kind: self._figure(kind, self.study_figure_inputs(kind)) for kind in self.study_figure_kinds()}

    def _figure(self, kind: str, inputs: list[str], source: str | None = None, layer: int | None = None) -> dict:
        return {"kind": kind, "layer": layer, "inputs": inputs, "options": self.figure_options(kind, source)}

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
                for kind in self.layer_figure_kinds(source):
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
