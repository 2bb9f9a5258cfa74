"""A normalized config seen as a grid: checkpoints x variants (the sources) x prompts x
seeds x layer groups, and where the study's files go.

The base of ``sinkscope.pipeline.study.Study``; the stage planners
(``extractplan``, ``effectsplan``, ``figureplan``, ``videoplan``) read the grid from
here. Sources: what gets its own tables and figures. A checkpoint with the ``default``
generation is named like the checkpoint; a checkpoint under another variant is
``<checkpoint>@<variant>``; imported legacy caches are sources too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.model.checkpoints import ResolvedCheckpoint, cached_value, files_digest
from sinkscope.options import GenerationOptions
from sinkscope.pipeline.codedigest import stage_digest
from sinkscope.pipeline.config import generation_options, resolve_checkpoints, study_layers_per_job, variant_names
from sinkscope.pipeline.layout import DEFAULT_VARIANT, RESULTS, path, results_folder, source_name
from sinkscope.prompt_schedules import PromptSegment, prompt_segments, switch_frames

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

    # -- sources -----------------------------------------------------------------------------------

    @property
    def variants(self) -> list[str]:
        return variant_names(self.config)

    @property
    def effect_variants(self) -> list[str]:
        """The variants paired with the untouched run: every one but ``default``, when the
        study has ``default`` and at least one other (else none)."""
        others = [variant for variant in self.variants if variant != DEFAULT_VARIANT]
        return others if DEFAULT_VARIANT in self.variants else []

    @property
    def legacy(self) -> dict[str, dict]:
        return dict(self.config.get("legacy_caches", {}))

    source_name = staticmethod(source_name)

    @cached_property
    def runs(self) -> dict[str, tuple[str, str]]:
        """Source name -> (checkpoint, variant), for every extracted source."""
        return {self.source_name(c, v): (c, v) for c in self.checkpoints for v in self.variants}

    @property
    def sources(self) -> list[str]:
        """Everything that gets tables and figures: extracted sources, then imported caches."""
        return list(self.runs) + list(self.legacy)

    def checkpoint_of(self, source: str) -> str:
        return self.runs[source][0] if source in self.runs else source

    def sources_of(self, checkpoint: str) -> list[str]:
        return [source for source, (c, _) in self.runs.items() if c == checkpoint] or [checkpoint]

    @cached_property
    def options(self) -> dict[str, GenerationOptions]:
        """Source -> the generation options it runs (the study's, the checkpoint's own, the variant's)."""
        return {
            self.source_name(c, v): generation_options(self.config, v, c)
            for c in self.checkpoints
            for v in self.variants
        }

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
