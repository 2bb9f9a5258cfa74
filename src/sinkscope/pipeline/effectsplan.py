"""The plan of interventions and their effects: edits that select heads by class wait for
the untouched run's head classes (rules/interventions.smk); each variant is paired with
the untouched run of its checkpoint (rules/effects.smk; the job:
``sinkscope.pipeline.effects``); a checkpoint's atlas runs give its atlas tables, and a
head sweep that a pruning sweep ranks gives its head orders, which the pruning runs wait
for (rules/atlas.smk; the jobs: ``sinkscope.pipeline.atlas``, ``sinkscope.pipeline.headorders``).

Torch-free: the Snakefile calls it while it parses.
"""

from __future__ import annotations

from typing import Any

from sinkscope.interventions import atlas_selections
from sinkscope.pipeline.extractplan import ExtractionPlan
from sinkscope.pipeline.layout import ATLAS_TABLES, DEFAULT_VARIANT, EFFECT_TABLES
from sinkscope.sweeps import HEAD, sweep_item


class EffectsPlan(ExtractionPlan):
    """Which runs wait for head classes or head orders, what each checkpoint's effects and
    atlas jobs read."""

    def selects_by_class(self, source: str) -> bool:
        """Whether the run's edits select heads by class (``class:sink``)."""
        from sinkscope.interventions import class_selections

        options = self.options.get(source)
        return options is not None and bool(class_selections(options.interventions))

    @property
    def class_checkpoints(self) -> list[str]:
        """The checkpoints a run of which selects heads by class."""
        classed = {self.checkpoint_of(source) for source in self.runs if self.selects_by_class(source)}
        return [checkpoint for checkpoint in self.checkpoints if checkpoint in classed]

    def head_classes_inputs(self, source: str) -> list[str]:
        """The head classes file an extraction of ``source`` waits for: the checkpoint's
        untouched run's, when its edits select heads by class; none otherwise."""
        if not self.selects_by_class(source):
            return []
        return [self.path("intervention_classes", checkpoint=self.checkpoint_of(source))]

    def head_classes_diagnostics(self, checkpoint: str) -> str:
        """The table the checkpoint's head classes come from: its default run's head_diagnostics."""
        return self.path("source_table", source=self.source_name(checkpoint, DEFAULT_VARIANT), table="head_diagnostics")

    def paired_sources(self, checkpoint: str) -> list[str]:
        """The checkpoint's untouched run and every run paired with it."""
        return [self.source_name(checkpoint, v) for v in (DEFAULT_VARIANT, *self.paired_variants(checkpoint))]

    def effects_inputs(self, checkpoint: str) -> list[str]:
        """The extraction folders of the checkpoint's default and paired runs, and the files
        their edits select heads by (head classes, head orders)."""
        sources = self.paired_sources(checkpoint)
        inputs = [folder for source in sources for folder in self.extract_dirs(source)]
        return inputs + sorted({file for source in sources for file in self.edit_inputs(source)})

    def effects_params(self, checkpoint: str) -> dict[str, Any]:
        """The checkpoint and each paired variant's edits (canonical config form)."""
        edits = {
            v: self.options[self.source_name(checkpoint, v)].to_dict().get("interventions", [])
            for v in self.paired_variants(checkpoint)
        }
        return {"checkpoint": checkpoint, "interventions": edits}

    @property
    def has_effects(self) -> bool:
        return any(self.paired_variants(checkpoint) for checkpoint in self.checkpoints)

    def effects_targets(self) -> list[str]:
        """The effects tables, per checkpoint and combined (none without paired variants)."""
        if not self.has_effects:
            return []
        per_checkpoint = [
            self.path("effects_table", checkpoint=c, table=t) for c in self.checkpoints for t in EFFECT_TABLES
        ]
        return per_checkpoint + [self.path("table", table=t) for t in EFFECT_TABLES]

    def class_targets(self) -> list[str]:
        """The untouched runs' head classes: for the runs that select heads by class, and for
        the atlases (a head atlas gives each head's class beside its drift)."""
        classed = set(self.class_checkpoints) | (set(self.checkpoints) if self.has_atlas else set())
        return [self.path("intervention_classes", checkpoint=c) for c in self.checkpoints if c in classed]

    # -- atlases ----------------------------------------------------------------------------------

    @property
    def has_atlas(self) -> bool:
        """Whether a checkpoint has atlas runs paired with its untouched run."""
        return self.has_effects and any(self.atlas_variants(checkpoint) for checkpoint in self.checkpoints)

    def atlas_inputs(self, checkpoint: str) -> dict[str, list[str]]:
        """What a checkpoint's atlas tables read: its variant_effects table, its untouched
        runs' extraction folders and its untouched run's head classes."""
        return {
            "effects": [self.path("effects_table", checkpoint=checkpoint, table="variant_effects")],
            "default_runs": self.extract_dirs(self.source_name(checkpoint, DEFAULT_VARIANT)),
            "head_classes": [self.path("intervention_classes", checkpoint=checkpoint)],
        }

    def atlas_params(self, checkpoint: str) -> dict[str, Any]:
        """The checkpoint and its untouched run's sink frames (a frame atlas marks them)."""
        return {
            "checkpoint": checkpoint,
            "sink_frames": self.options[self.source_name(checkpoint, DEFAULT_VARIANT)].sink_frames,
        }

    def atlas_targets(self) -> list[str]:
        """The atlas tables, per checkpoint and combined (none without atlas runs)."""
        if not self.has_atlas:
            return []
        per_checkpoint = [
            self.path("effects_table", checkpoint=c, table=t) for c in self.checkpoints for t in ATLAS_TABLES
        ]
        return per_checkpoint + [self.path("table", table=t) for t in ATLAS_TABLES]

    @property
    def ranked_atlases(self) -> list[tuple[str, str]]:
        """(checkpoint, head sweep) of every head atlas whose orders a run selects heads by
        (``atlas:``: the pruning runs)."""
        found = {
            (checkpoint, sweep)
            for source, (checkpoint, _) in self.runs.items()
            for sweep in atlas_selections(self.options[source].interventions)
        }
        return sorted(found)

    def head_orders_inputs(self, checkpoint: str, sweep: str) -> list[str]:
        """What a head sweep's orders are computed from: the extraction folders of its runs
        (a sweep's, or variants ``<sweep>/<head>`` written by hand) and of the untouched run.
        Not the checkpoint's head_atlas table: that pairs the pruning runs too, which wait
        for these orders."""
        runs = []
        for variant in self.atlas_variants(checkpoint):
            item = sweep_item(variant)
            if item is not None and item.sweep == sweep and item.axis == HEAD:
                runs.append(self.source_name(checkpoint, variant))
        if not runs:
            raise ValueError(f"{sweep!r} is not a sweep of heads: each")
        sources = [self.source_name(checkpoint, DEFAULT_VARIANT), *runs]
        return [folder for source in sources for folder in self.extract_dirs(source)]

    def head_orders_targets(self) -> list[str]:
        return [self.path("head_orders", checkpoint=c, sweep=s) for c, s in self.ranked_atlases]
