"""The extraction stage's plan: prompt embeddings, the extraction folders of each run,
the jobs that generate them, imported caches, and the canonical params of the extraction
and aggregation jobs (equivalent configs give equal params, so nothing reruns for a
rewording).

A job generates the atlas runs of one checkpoint, for one prompt and seed, one after
another with the model loaded (and compiled) once: up to ``runs_per_job`` runs that wait
for the same files (the head classes or head orders their edits select by). Runs are put
in jobs by their names alone (in natural order, in chunks of equal size), so the jobs and
their params depend only on the set of runs, not on how the config wrote them (a sweep, or
its variants by hand). Every job of several runs is a rule of its own
(``extraction_jobs``), its outputs its runs' folders. The other runs (the untouched run, the
variants with tables of their own) and a run alone in its chunk are the rule
``extract_attention``'s, one folder a job: Snakemake reruns a job whole, and everything
that reads any of its outputs, so a variant edited would rerun the tables and figures of
every variant in its job; atlas runs are read only by their checkpoint's effects and
atlases, which read them all anyway.

Torch-free: the Snakefile calls it while it parses (rules/extract.smk, aggregate.smk).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError
from sinkscope.interventions import atlas_selections, class_selections
from sinkscope.model.checkpoints import files_digest, find_vae
from sinkscope.naming import decode_layers, encode_layers
from sinkscope.options import procedure_spec
from sinkscope.pipeline.config import CAPTURE_STATISTICS, generation_options
from sinkscope.pipeline.grid import DIGEST_CACHE, StudyGrid
from sinkscope.pipeline.layout import DEFAULT_VARIANT, SOURCE_TABLES, STAGING
from sinkscope.pipeline.resources import default_dtype


@dataclass(frozen=True)
class ExtractionJob:
    """Runs of one checkpoint that one job generates in turn, for each prompt and seed: the
    rule ``rule``, its logs under ``label``, the files its runs' edits wait for (``inputs``)."""

    rule: str
    label: str
    checkpoint: str
    sources: tuple[str, ...]
    inputs: tuple[str, ...]


def _natural(name: str) -> list:
    """A sort key that orders numbers in names by value (L2H3 before L10H1)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def chunks(count: int, size: int) -> list[int]:
    """The sizes of ``count`` items in as few chunks of at most ``size`` as can be, their
    sizes differing by one at most (the larger first)."""
    if count <= 0:
        return []
    parts = -(-count // max(1, size))
    return [count // parts + (1 if i < count % parts else 0) for i in range(parts)]


class ExtractionPlan(StudyGrid):
    """What the extraction, import and aggregation jobs of a study read, write and get."""

    # -- files -------------------------------------------------------------------------------------

    def extract_dirs(self, source: str, layer: int | None = None) -> list[str]:
        """Extraction outputs of one run (only those holding ``layer``, if given)."""
        groups = [encode_layers(g) for g in self.run_groups(source) if layer is None or layer in g]
        return [
            self.path("extract_dir", source=source, prompt=prompt, seed=seed, group=group)
            for prompt in self.prompts
            for seed in self.seeds
            for group in groups
        ]

    def all_extract_dirs(self) -> list[str]:
        return [d for source in self.runs for d in self.extract_dirs(source)]

    def source_inputs(self, source: str, layer: int | None = None) -> list[str]:
        """The frame-level inputs of a source's aggregation (or of one layer's figures)."""
        if source in self.legacy:
            return [self.path("imported", source=source)]
        return self.extract_dirs(source, layer)

    def source_tables(self, source: str) -> dict[str, str]:
        """The per-source tables the aggregation job writes (named outputs)."""
        return {table: self.path("source_table", source=source, table=table) for table in SOURCE_TABLES}

    def embedding(self, checkpoint: str, prompt: str) -> str:
        """The embedding file of a single prompt."""
        return self.path("embedding", encoder=self.text_encoder(checkpoint).key, prompt=prompt)

    def embeddings(self, checkpoint: str, prompt: str) -> list[str]:
        """The prompt's embedding files: one for a single prompt, one per segment of a schedule."""
        if isinstance(self.config["prompts"][prompt], str):
            return [self.embedding(checkpoint, prompt)]
        key = self.text_encoder(checkpoint).key
        return [
            self.path("segment_embedding", encoder=key, prompt=prompt, segment=i)
            for i in range(len(self.prompt_segments(prompt)))
        ]

    def all_embeddings(self) -> list[str]:
        return sorted(
            {
                file
                for checkpoint in self.checkpoints
                for prompt in self.prompts
                for file in self.embeddings(checkpoint, prompt)
            }
        )

    # -- checkpoints, encoders and their digests ----------------------------------------------------

    def model_config(self, checkpoint: str):
        return self.checkpoints[checkpoint].model_config

    def text_encoder(self, checkpoint: str):
        return self.checkpoints[checkpoint].text_encoder()

    @cached_property
    def encoders(self) -> dict[str, Any]:
        """Text encoder key -> spec, for every checkpoint's encoder."""
        found = {}
        for name in self.checkpoints:
            try:
                encoder = self.text_encoder(name)
            except (FileNotFoundError, ValueError) as error:
                raise ConfigError.invalid([f"config key checkpoints.{name}: {error}"]) from None
            found[encoder.key] = encoder
        return found

    def encoder_sha256(self, key: str) -> str:
        return files_digest(self.encoders[key].files(), cache=Path(self.base_dir) / DIGEST_CACHE)

    def weights_sha256(self, checkpoint: str) -> str:
        """The checkpoint's weights digest, cached by file size and mtime."""
        return self.checkpoints[checkpoint].digest(cache=Path(self.base_dir) / DIGEST_CACHE)

    def files_sha256(self, path: Path) -> str:
        """The digest of a file, or of every file in a folder (a diffusers ``vae/``), cached as
        the weights' are, and kept for this study's life."""
        if path not in self._digests:
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            self._digests[path] = files_digest(files, cache=Path(self.base_dir) / DIGEST_CACHE)
        return self._digests[path]

    def generation_vae_sha256(self, source: str) -> str:
        """The digest of the Wan VAE of a source whose generation runs it (Krea's re-encode of a
        context frame: new VAE bytes rerun its extraction); '' for every other source."""
        options = self.options[source]
        if not procedure_spec(options.procedure).needs_vae(options):
            return ""
        vae = find_vae(self.checkpoints[self.checkpoint_of(source)])
        return "" if vae is None else self.files_sha256(vae)

    # -- job params -------------------------------------------------------------------------------

    def compute(self, checkpoint: str) -> dict[str, str]:
        """Device and dtype the extraction computes in (precision is provenance)."""
        return {"device": self.device, "dtype": default_dtype(self.device, self.checkpoints[checkpoint].spec.dtype)}

    def checkpoint_spec(self, checkpoint: str) -> dict[str, Any]:
        """The checkpoint as its extraction jobs get it."""
        resolved = self.checkpoints[checkpoint]
        # train_step only orders a figure; format 'auto' and the format it detects are one.
        spec = {**resolved.spec.to_dict(), "format": resolved.format}
        spec.pop("train_step", None)
        return spec

    def capture_params(self, source: str) -> dict[str, Any]:
        """What a run captures (an atlas run: no token profiles, unless capture.atlas_runs is all)."""
        capture = self.config["capture"]
        chosen = {key: capture[key] for key in ("backend", "attention", "kernels", "compile", "token_profiles")}
        if self.is_atlas_run(source) and capture.get("atlas_runs", "edited") != "all":
            chosen["token_profiles"] = "none"
        # Only where a study narrows it: a job of every statistic keeps the params it had.
        if tuple(capture["statistics"]) != CAPTURE_STATISTICS:
            chosen["statistics"] = list(capture["statistics"])
        # Graphs leave the video as it is: only turning them off is a param (a job reruns then).
        if not capture.get("cuda_graphs", True):
            chosen["cuda_graphs"] = False
        # A pinned attention kernel is a param; auto (which the manifest resolves) keeps old params.
        if capture.get("attention_kernel", "auto") != "auto":
            chosen["attention_kernel"] = capture["attention_kernel"]
        return chosen

    def extract_params(self, source: str, group: str) -> dict[str, Any]:
        checkpoint, variant = self.runs[source]
        return {
            "checkpoint": self.checkpoint_spec(checkpoint),
            "variant": variant,
            "layers": decode_layers(group),
            "generation": self.options[source].to_dict(),
            "capture": self.capture_params(source),
            "compute": self.compute(checkpoint),
        }

    # -- jobs of several runs (runs_per_job) ------------------------------------------------------

    def edit_inputs(self, source: str) -> list[str]:
        """The files a run's extraction waits for: the untouched run's head classes when its
        edits select heads by class, each head atlas's orders it selects by (``atlas:``)."""
        options = self.options.get(source)
        if options is None:
            return []
        checkpoint = self.checkpoint_of(source)
        files = (
            [self.path("intervention_classes", checkpoint=checkpoint)]
            if class_selections(options.interventions)
            else []
        )
        return files + [
            self.path("head_orders", checkpoint=checkpoint, sweep=sweep)
            for sweep in atlas_selections(options.interventions)
        ]

    @cached_property
    def extraction_jobs(self) -> list[ExtractionJob]:
        """The jobs of several runs, each a rule of its own: per checkpoint, the atlas runs
        that wait for the same files in natural order of their names, in chunks of equal size
        of at most ``runs_per_job`` (a run alone in its chunk is the rule ``extract_attention``'s)."""
        jobs = []
        for checkpoint in self.checkpoints:
            waiting: dict[tuple[str, ...], list[str]] = {}
            for source, (owner, _) in self.runs.items():
                if owner == checkpoint and self.is_atlas_run(source):
                    waiting.setdefault(tuple(self.edit_inputs(source)), []).append(source)
            for inputs, sources in sorted(waiting.items()):
                sources.sort(key=_natural)
                start = 0
                for size in chunks(len(sources), self.runs_per_job):
                    members = tuple(sources[start : start + size])
                    start += size
                    if size > 1:
                        label = f"job{sum(job.checkpoint == checkpoint for job in jobs) + 1}"
                        jobs.append(ExtractionJob(f"extract_runs_{len(jobs) + 1}", label, checkpoint, members, inputs))
        return jobs

    @cached_property
    def single_runs(self) -> list[str]:
        """The runs extracted one a job (rule ``extract_attention``)."""
        grouped = {source for job in self.extraction_jobs for source in job.sources}
        return [source for source in self.runs if source not in grouped]

    def job_folders(self, job: ExtractionJob) -> list[tuple[str, str]]:
        """(run, layer group) of each folder the job writes for one prompt and seed, in order."""
        return [(source, encode_layers(group)) for source in job.sources for group in self.run_groups(source)]

    def job_vae_sha256(self, job: ExtractionJob) -> dict[str, str]:
        """Variant -> the digest of the Wan VAE its generation runs, for the job's runs that run one."""
        found = {self.runs[source][1]: self.generation_vae_sha256(source) for source in job.sources}
        return {variant: digest for variant, digest in found.items() if digest}

    @property
    def staging(self) -> str:
        """Where jobs of several runs keep the runs they finished until the job ends."""
        return f"{self.results}/{STAGING}"

    def job_params(self, job: ExtractionJob) -> dict[str, Any]:
        """What a job of several runs gets: the checkpoint, the compute, the checkpoint's
        untouched generation, and per run its variant, its layer groups, what it captures
        and its generation as the keys that differ from the untouched one (``generation``,
        ``without``: keys it lacks), so the params stay small for hundreds of runs.
        ``run_params`` gives a run's params back, equal to ``extract_params``."""
        base = generation_options(self.config, DEFAULT_VARIANT, job.checkpoint).to_dict()
        runs = []
        for source in job.sources:
            generation = self.options[source].to_dict()
            run: dict[str, Any] = {
                "variant": self.runs[source][1],
                "groups": [list(group) for group in self.run_groups(source)],
                "capture": self.capture_params(source),
                "generation": {key: value for key, value in generation.items() if base.get(key, ...) != value},
            }
            without = sorted(set(base) - set(generation))
            if without:
                run["without"] = without
            runs.append(run)
        return {
            "checkpoint": self.checkpoint_spec(job.checkpoint),
            "compute": self.compute(job.checkpoint),
            "generation": base,
            "runs": runs,
        }

    def aggregate_params(self, source: str) -> dict[str, Any]:
        options = self.options.get(source)
        return {
            "name": source,
            "sink_frames": options.sink_frames if options is not None else 0,
            "diagnostics": {k: v for k, v in self.config["diagnostics"].items() if k != "reference_labels"},
        }


def run_params(job_params: dict[str, Any], index: int, layers: list[int]) -> dict[str, Any]:
    """The params of run ``index`` of a job of several runs (``ExtractionPlan.job_params``)
    for one of its layer groups: what ``extract_params`` gives the same run alone."""
    run = job_params["runs"][index]
    generation = {**job_params["generation"], **run["generation"]}
    for key in run.get("without", ()):
        generation.pop(key, None)
    return {
        "checkpoint": job_params["checkpoint"],
        "variant": run["variant"],
        "layers": list(layers),
        "generation": generation,
        "capture": run["capture"],
        "compute": job_params["compute"],
    }
