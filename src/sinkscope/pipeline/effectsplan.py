"""The plan of interventions and their effects: edits that select heads by class wait for
the untouched run's head classes (rules/interventions.smk); each variant is paired with
the untouched run of its checkpoint (rules/effects.smk; the job:
``sinkscope.pipeline.effects``).

Torch-free: the Snakefile calls it while it parses.
"""

from __future__ import annotations

from typing import Any

from sinkscope.pipeline.extractplan import ExtractionPlan
from sinkscope.pipeline.layout import DEFAULT_VARIANT, EFFECT_TABLES


class EffectsPlan(ExtractionPlan):
    """Which runs wait for head classes, and what each checkpoint's effects job reads."""

    def selects_by_class(self, source: str) -> bool:
        """Whether the source's edits select heads by class (``class:sink``)."""
        from sinkscope.interventions import class_selections

        options = self.options.get(source)
        return options is not None and bool(class_selections(options.interventions))

    @property
    def class_checkpoints(self) -> list[str]:
        """The checkpoints a variant of which selects heads by class."""
        return [
            c for c in self.checkpoints if any(self.selects_by_class(self.source_name(c, v)) for v in self.variants)
        ]

    def head_classes_inputs(self, source: str) -> list[str]:
        """The head classes file an extraction of ``source`` waits for: the checkpoint's
        untouched run's, when its edits select heads by class; none otherwise."""
        if not self.selects_by_class(source):
            return []
        return [self.path("intervention_classes", checkpoint=self.checkpoint_of(source))]

    def head_classes_diagnostics(self, checkpoint: str) -> str:
        """The table the checkpoint's head classes come from: its default run's head_diagnostics."""
        return self.path("source_table", source=self.source_name(checkpoint, DEFAULT_VARIANT), table="head_diagnostics")

    def effects_inputs(self, checkpoint: str) -> list[str]:
        """The extraction folders of the checkpoint's default and paired variants, and the
        head classes file when an edit selects heads by class."""
        sources = [self.source_name(checkpoint, v) for v in (DEFAULT_VARIANT, *self.effect_variants)]
        inputs = [folder for source in sources for folder in self.extract_dirs(source)]
        if checkpoint in self.class_checkpoints:
            inputs.append(self.path("intervention_classes", checkpoint=checkpoint))
        return inputs

    def effects_params(self, checkpoint: str) -> dict[str, Any]:
        """The checkpoint and each paired variant's edits (canonical config form)."""
        edits = {
            v: self.options[self.source_name(checkpoint, v)].to_dict().get("interventions", [])
            for v in self.effect_variants
        }
        return {"checkpoint": checkpoint, "interventions": edits}

    def effects_targets(self) -> list[str]:
        """The effects tables, per checkpoint and combined (none without paired variants)."""
        if not self.effect_variants:
            return []
        per_checkpoint = [
            self.path("effects_table", checkpoint=c, table=t) for c in self.checkpoints for t in EFFECT_TABLES
        ]
        return per_checkpoint + [self.path("table", table=t) for t in EFFECT_TABLES]

    def class_targets(self) -> list[str]:
        return [self.path("intervention_classes", checkpoint=c) for c in self.class_checkpoints]
