"""A normalized config seen as a grid: checkpoints x variants (the runs) x prompts x
seeds x layer groups, and where the study's files go.

The base of ``sinkscope.pipeline.study.Study``; the stage planners
(``extractplan``, ``effectsplan``, ``figureplan``, ``videoplan``) read the grid from
here. Runs: what gets extracted. A checkpoint with the ``default`` generation is named
like the checkpoint; a checkpoint under another variant is ``<checkpoint>@<variant>``.
A sweep's variants (``sweeps:``, each checkpoint's own: its model's heads) and variants
named ``<sweep>/<item>`` are atlas runs: extracted and paired with the untouched run, with
no tables or figures of their own, capturing what the atlas reads (``run_groups``).
Sources: what gets its own tables and figures: the other runs, and imported legacy caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.interventions import ATTENTION_EDITS
from sinkscope.model.checkpoints import ResolvedCheckpoint, cached_value, files_digest
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.codedigest import stage_digest
from sinkscope.pipeline.config import checkpoint_sweeps, generation_options, resolve_checkpoints, variant_names
from sinkscope.pipeline.layout import DEFAULT_VARIANT, RESULTS, path, results_folder, source_name
from sinkscope.pipeline.machinecheck import resolve_runs_per_job, study_layers_per_job
from sinkscope.prompt_schedules import PromptSegment, prompt_segments, switch_frames
from sinkscope.sweeps import Sweep, is_atlas_run, parse_sweeps

# Digests of weight files, text encoders and legacy-cache layouts, reused while their
# size and mtime hold.
DIGEST_CACHE = ".snakemake/sinkscope/sha256.json"
LEGACY_CACHE = ".snakemake/sinkscope/legacy-layers.json"


@dataclass
class StudyGrid:
    """The grid of a normalized config: its sources, runs, layer groups and paths."""

    config: Mapping[str, Any]
    base_dir: str = "."
    # The device extraction jobs compute on ('cpu', 'cuda', 'cuda:N'), as check_machine resolved it.
    device: str = "cpu"
    checkpoints: dict[str, ResolvedCheckpoint] = field(default=None)  # type: ignore[assignment]
    # Path -> digest (files_sha256): a VAE's once per workflow parse, not once per job.
    _digests: dict[Path, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.checkpoints is None:
            self.checkpoints = resolve_checkpoints(self.config, self.base_dir)

    @cached_property
    def results(self) -> str:
        """The folder every result of the study goes under (config key ``results``)."""
        return results_folder(self.config.get("results", RESULTS))

    def path(self, name: str, **wildcards: Any) -> str:
        """A path of the study: ``layout.PATTERNS[name]`` in its results folder, filled in."""
        return path(name, self.results, **wildcards)

    @staticmethod
    def code(stage: str) -> str:
        """Digest of the package code a stage runs (a rule param: changed code reruns it)."""
        return stage_digest(stage)

    # -- prompts, seeds, layers ----------------------------------------------------------------

    @property
    def prompts(self) -> dict[str, str | list]:
        """Prompt id -> its text, or its schedule (a list of {text, start_frame})."""
        return dict(self.config["prompts"])

    def prompt_segments(self, prompt: str) -> tuple[PromptSegment, ...]:
        return prompt_segments(self.config["prompts"][prompt])

    def segment_starts(self, prompt: str) -> list[int]:
        """The latent frames where the prompt's segments start ([0] for a single prompt)."""
        return [segment.start_frame for segment in self.prompt_segments(prompt)]

    def segment_text(self, prompt: str, segment: int | str) -> str:
        return self.prompt_segments(prompt)[int(segment)].text

    @property
    def switches(self) -> dict[str, list[int]]:
        """Prompt id -> the frames where it switches, for the prompts that do."""
        found = {prompt: switch_frames(self.prompt_segments(prompt)) for prompt in self.prompts}
        return {prompt: frames for prompt, frames in found.items() if frames}

    @property
    def seeds(self) -> list[int]:
        return list(self.config["seeds"])

    @property
    def layers(self) -> list[int]:
        """The layers to capture, in the config's order."""
        return list(self.config["layers"])

    @cached_property
    def layers_per_job(self) -> int:
        return study_layers_per_job(self.config, self.checkpoints, self.device)

    @cached_property
    def layer_groups(self) -> list[list[int]]:
        """Layers captured together: consecutive chunks of ``layers`` in the config's order,
        so ``layers: [0, 4]`` with ``layers_per_job: 4`` is one generation."""
        size = self.layers_per_job
        return [self.layers[i : i + size] for i in range(0, len(self.layers), size)]

    @cached_property
    def runs_per_job(self) -> int:
        """The most runs one extraction job generates (``runs_per_job``)."""
        return resolve_runs_per_job(self.config.get("runs_per_job", "auto"))

    # -- variants, sweeps and runs -------------------------------------------------------------------

    @property
    def variants(self) -> list[str]:
        """The study's variants that get tables and figures (``default`` among them when it
        pairs with edited runs); atlas runs are each checkpoint's (``atlas_variants``)."""
        return [variant for variant in variant_names(self.config) if not is_atlas_run(variant)]

    @cached_property
    def sweeps(self) -> dict[str, Sweep]:
        """The study's sweeps, parsed (``sinkscope.sweeps``)."""
        return parse_sweeps(self.config.get("sweeps") or {}, self.config.get("variants") or {})

    @cached_property
    def _swept(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {
            name: checkpoint_sweeps(self.config, self.sweeps, name, checkpoint.model_config).variants
            if self.sweeps
            else {}
            for name, checkpoint in self.checkpoints.items()
        }

    def swept(self, checkpoint: str) -> dict[str, dict[str, Any]]:
        """The checkpoint's swept variants: name (``<sweep>/<item>``) -> its ``variants:`` entry."""
        return self._swept[checkpoint]

    def atlas_variants(self, checkpoint: str) -> list[str]:
        """The checkpoint's atlas runs: variants named ``<sweep>/<item>`` by hand, then its
        sweeps' variants."""
        return [v for v in variant_names(self.config) if is_atlas_run(v)] + list(self.swept(checkpoint))

    def variants_of(self, checkpoint: str) -> list[str]:
        """Every variant the checkpoint runs: the study's, then its atlas runs."""
        return self.variants + self.atlas_variants(checkpoint)

    @property
    def effect_variants(self) -> list[str]:
        """The variants with tables of their own paired with the untouched run: every one but
        ``default``, when the study has ``default`` and at least one other (else none)."""
        others = [variant for variant in self.variants if variant != DEFAULT_VARIANT]
        return others if DEFAULT_VARIANT in self.variants else []

    def paired_variants(self, checkpoint: str) -> list[str]:
        """Every variant of the checkpoint paired with its untouched run, atlas runs included."""
        if DEFAULT_VARIANT not in self.variants:
            return []
        return [variant for variant in self.variants_of(checkpoint) if variant != DEFAULT_VARIANT]

    @property
    def legacy(self) -> dict[str, dict]:
        return dict(self.config.get("legacy_caches", {}))

    source_name = staticmethod(source_name)

    @cached_property
    def runs(self) -> dict[str, tuple[str, str]]:
        """Run name -> (checkpoint, variant), for every extracted run (atlas runs included)."""
        return {self.source_name(c, v): (c, v) for c in self.checkpoints for v in self.variants_of(c)}

    def is_atlas_run(self, source: str) -> bool:
        return source in self.runs and is_atlas_run(self.runs[source][1])

    @property
    def sources(self) -> list[str]:
        """Everything that gets tables and figures: extracted runs but atlas runs, then
        imported caches."""
        return [run for run, (_, variant) in self.runs.items() if not is_atlas_run(variant)] + list(self.legacy)

    def checkpoint_of(self, source: str) -> str:
        return self.runs[source][0] if source in self.runs else source

    def sources_of(self, checkpoint: str) -> list[str]:
        """The checkpoint's sources (its runs with tables of their own)."""
        found = [s for s, (c, v) in self.runs.items() if c == checkpoint and not is_atlas_run(v)]
        return found or [checkpoint]

    @cached_property
    def options(self) -> dict[str, GenerationOptions]:
        """Run -> the generation options it runs (the study's, the checkpoint's own, the variant's)."""
        return {
            source: generation_options(self.config, v, c, self.swept(c).get(v)) for source, (c, v) in self.runs.items()
        }

    def run_groups(self, source: str) -> list[list[int]]:
        """The layers each of a run's extraction folders captures: the study's layer groups;
        an atlas run's (``capture.atlas_runs: edited``), those of the study's layers that
        hold a head it edits (every one for an edit of every head, without heads, or of
        heads known only in the job), the first of them when none does, grouped by
        ``layers_per_job`` (on the CPU, ``auto``: one group)."""
        if not self.is_atlas_run(source) or self.config["capture"].get("atlas_runs", "edited") == "all":
            return self.layer_groups
        edited = edited_layers(self.options[source], self.model_config_of(source).num_layers)
        chosen = [layer for layer in self.layers if layer in edited] or self.layers[:1]
        # layers_per_job: auto on the CPU is one layer a job, so that a rerun stays small; an
        # atlas run is one generation whatever it captures (memory is no bound on the CPU).
        cpu_auto = self.config["layers_per_job"] == "auto" and not self.device.startswith("cuda")
        size = len(chosen) if cpu_auto else self.layers_per_job
        return [chosen[i : i + size] for i in range(0, len(chosen), size)]

    def model_config_of(self, source: str):
        return self.checkpoints[self.checkpoint_of(source)].model_config

    def token_profiles(self, source: str) -> bool:
        """Whether the source has token profiles (extracted with capture.token_profiles)."""
        return source in self.runs and self.config["capture"]["token_profiles"] != "none"

    def source_layers(self, source: str) -> list[int]:
        if source in self.legacy:
            return self._legacy_layers(source)
        return sorted(self.layers)

    def _legacy_layers(self, source: str) -> list[int]:
        """The layers of a legacy cache: read once (unpickling needs torch), then cached
        by the file's digest, so parsing the workflow stays torch-free."""
        entry = self.legacy[source]
        file = Path(entry["path"])
        file = file if file.is_absolute() else Path(self.base_dir) / file
        cache = Path(self.base_dir) / LEGACY_CACHE

        def peek() -> list[int]:
            from sinkscope.legacy.importer import peek_layers
            from sinkscope.legacy.plan import check_cache

            layers = peek_layers(file, allow_pickle=entry["allow_pickle"])
            # What the import job would refuse in the values (NaN, fields that disagree
            # with the tensors), refused now, before any job.
            check_cache(file, allow_pickle=entry["allow_pickle"])
            return layers

        try:
            digest = files_digest([file], cache=Path(self.base_dir) / DIGEST_CACHE)
            return cached_value(f"{digest}:{entry['allow_pickle']}:values", cache, peek)
        except (ValueError, FileNotFoundError) as error:
            raise ConfigError(f"config key legacy_caches.{source}: {error}") from None


def edited_layers(options: GenerationOptions, num_layers: int) -> frozenset[int]:
    """The layers whose attention a run's edits change, as far as the plan knows them: the
    layers of the heads an attention edit names; every layer for every head, for heads
    chosen by class or by an atlas's order (known only in the job), and for a cache edit
    (every head reads the cache)."""
    layers: set[int] = set()
    for edit in options.interventions:
        heads = edit.heads if isinstance(edit, ATTENTION_EDITS) else None
        if heads is None or heads.kind == "all" or heads.by_class or heads.by_atlas:
            return frozenset(range(num_layers))
        layers |= set(heads.layers) | {layer for layer, _ in heads.heads}
    return frozenset(layers)
