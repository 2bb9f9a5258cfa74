"""What the Snakefile needs from a config: paths, job groups, canonical rule params.

The file tree under ``results/`` is defined here, once, as wildcard patterns
(``PATTERNS``); the rules use the patterns and the targets are the same patterns
filled in. Nothing here imports torch or pandas: the Snakefile parses in well under
a second of sinkscope's own time.

Sources: what gets its own tables and figures. A checkpoint with the ``default``
generation is named like the checkpoint (today's paths); a checkpoint under another
variant is ``<checkpoint>@<variant>``; imported legacy caches are sources too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError, gathered
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
from sinkscope.model.checkpoints import ResolvedCheckpoint, cached_value, files_digest, find_vae
from sinkscope.naming import decode_layers, encode_layers, parse_head_label
from sinkscope.options import (
    GenerationOptions,
    procedure_spec,
)
from sinkscope.pipeline.codedigest import stage_digest
from sinkscope.pipeline.config import (
    CAPTURE_STATISTICS,
    check_config,
    check_machine,
    device_problems,
    generation_options,
    resolve_checkpoints,
    study_layers_per_job,
    variant_names,
)
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.resources import default_dtype
from sinkscope.prompt_schedules import PromptSegment, prompt_segments, switch_frames
from sinkscope.schema import schema_defaults

RESULTS = "results"
DEFAULT_VARIANT = "default"
VARIANT_SEPARATOR = "@"
# Digests of weight files, text encoders and legacy-cache layouts, reused while their
# size and mtime hold.
DIGEST_CACHE = ".snakemake/sinkscope/sha256.json"
LEGACY_CACHE = ".snakemake/sinkscope/legacy-layers.json"

# Tables per source (and combined over sources); token_profiles only with token capture.
TABLES = ("frame_attention", "head_stats", "layer_stats", "block_stats", "head_diagnostics")
SOURCE_TABLES = (*TABLES, "query_stats", "token_profiles")
# Per checkpoint (and combined): each variant paired with the untouched default run.
EFFECT_TABLES = ("variant_effects", "variant_head_effects")
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
PATTERNS = {
    "embedding": RESULTS + "/prompts/{encoder}/{prompt}.safetensors",
    # A prompt schedule: one embedding per segment.
    "segment_embedding": RESULTS + "/prompts/{encoder}/{prompt}/segment{segment}.safetensors",
    "extract_dir": RESULTS + "/extract/{source}/{prompt}/seed{seed}/layers{group}",
    "imported": RESULTS + "/imported/{source}/frame_attention.parquet",
    "source_table": RESULTS + "/tables/checkpoints/{source}/{table}.parquet",
    "head_classes_csv": RESULTS + "/tables/checkpoints/{source}/head_classes.csv",
    "table": RESULTS + "/tables/{table}.parquet",
    "source_figure": RESULTS + "/figures/{source}/{kind}.{ext}",
    "layer_figure": RESULTS + "/figures/{source}/layer{layer}/{kind}.{ext}",
    "checkpoint_figure": RESULTS + "/figures/{checkpoint}/{kind}.{ext}",
    "study_figure": RESULTS + "/figures/{kind}.{ext}",
    "summary": RESULTS + "/report/summary.html",
    # outputs.video / outputs.contact_sheet (sinkscope.pipeline.videoplan).
    "video": RESULTS + "/videos/{source}/{prompt}/seed{seed}.mp4",
    "contact_sheet": RESULTS + "/figures/{checkpoint}/contact_sheet/{prompt}/seed{seed}.{ext}",
    # The untouched (default) run's head classes, for edits that select heads by class.
    "intervention_classes": RESULTS + "/interventions/{checkpoint}/head_classes.json",
    "effects_table": RESULTS + "/tables/checkpoints/{checkpoint}/{table}.parquet",
}


def path(name: str, **wildcards: Any) -> str:
    """A results path: ``PATTERNS[name]`` with its wildcards filled in."""
    return PATTERNS[name].format(**wildcards)


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


@dataclass
class Study:
    """A normalized config seen as a grid of jobs and files."""

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

    # -- the grid --------------------------------------------------------------------------------

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

    @property
    def variants(self) -> list[str]:
        return variant_names(self.config)

    @property
    def legacy(self) -> dict[str, dict]:
        return dict(self.config.get("legacy_caches", {}))

    @cached_property
    def options(self) -> dict[str, GenerationOptions]:
        """Source -> the generation options it runs (the study's, the checkpoint's own, the variant's)."""
        return {
            self.source_name(c, v): generation_options(self.config, v, c)
            for c in self.checkpoints
            for v in self.variants
        }

    @staticmethod
    def source_name(checkpoint: str, variant: str) -> str:
        return checkpoint if variant == DEFAULT_VARIANT else f"{checkpoint}{VARIANT_SEPARATOR}{variant}"

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

    # -- layer groups ----------------------------------------------------------------------------

    @cached_property
    def layers_per_job(self) -> int:
        return study_layers_per_job(self.config, self.checkpoints, self.device)

    @cached_property
    def layer_groups(self) -> list[list[int]]:
        """Layers captured together: consecutive chunks of ``layers`` in the config's order,
        so ``layers: [0, 4]`` with ``layers_per_job: 4`` is one generation."""
        size = self.layers_per_job
        return [self.layers[i : i + size] for i in range(0, len(self.layers), size)]

    # -- paths -----------------------------------------------------------------------------------

    def extract_dirs(self, source: str, layer: int | None = None) -> list[str]:
        """Extraction outputs of one source (only those holding ``layer``, if given)."""
        groups = [encode_layers(g) for g in self.layer_groups if layer is None or layer in g]
        return [
            path("extract_dir", source=source, prompt=prompt, seed=seed, group=group)
            for prompt in self.prompts
            for seed in self.seeds
            for group in groups
        ]

    def all_extract_dirs(self) -> list[str]:
        return [d for source in self.runs for d in self.extract_dirs(source)]

    def source_inputs(self, source: str, layer: int | None = None) -> list[str]:
        """The frame-level inputs of a source's aggregation (or of one layer's figures)."""
        if source in self.legacy:
            return [path("imported", source=source)]
        return self.extract_dirs(source, layer)

    def token_profiles(self, source: str) -> bool:
        """Whether the source has token profiles (extracted with capture.token_profiles)."""
        return source in self.runs and self.config["capture"]["token_profiles"] != "none"

    def source_tables(self, source: str) -> dict[str, str]:
        """The per-source tables the aggregation job writes (named outputs)."""
        return {table: path("source_table", source=source, table=table) for table in SOURCE_TABLES}

    def embedding(self, checkpoint: str, prompt: str) -> str:
        """The embedding file of a single prompt."""
        return path("embedding", encoder=self.text_encoder(checkpoint).key, prompt=prompt)

    def embeddings(self, checkpoint: str, prompt: str) -> list[str]:
        """The prompt's embedding files: one for a single prompt, one per segment of a schedule."""
        if isinstance(self.config["prompts"][prompt], str):
            return [self.embedding(checkpoint, prompt)]
        key = self.text_encoder(checkpoint).key
        return [
            path("segment_embedding", encoder=key, prompt=prompt, segment=i)
            for i in range(len(self.prompt_segments(prompt)))
        ]

    # -- per-source facts --------------------------------------------------------------------------

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

    # -- targets -----------------------------------------------------------------------------------

    def figure_inputs(self, kind: str, source: str) -> list[str]:
        """The tables figure ``kind`` of ``source`` reads (a checkpoint's: all its variants)."""
        sources = self.sources_of(source) if kind in CHECKPOINT_FIGURES else [source]
        tables = [
            path("source_table", source=s, table=t)
            for s in sources
            for t in FIGURES[kind].inputs
            if t not in EFFECT_TABLES
        ]
        tables += [
            path("effects_table", checkpoint=source, table=t) for t in FIGURES[kind].inputs if t in EFFECT_TABLES
        ]
        if FIGURES[kind].needs_reference_labels:
            tables.append(str(self.config["diagnostics"]["reference_labels"]))
        return tables

    def layer_figure_inputs(self, kind: str, source: str, layer: int) -> list[str]:
        """The frame rows of one layer (extraction folders, or the imported file) and the
        source tables the kind also reads (head classes)."""
        tables = [path("source_table", source=source, table=t) for t in FIGURES[kind].uses]
        return self.source_inputs(source, layer) + tables

    def study_figure_inputs(self, kind: str) -> list[str]:
        return [path("table", table=t) for t in FIGURES[kind].inputs]

    def figure_kinds(self, source: str) -> list[str]:
        """Source figures to draw: token figures only with token profiles of a chosen head's layer."""
        from sinkscope.naming import parse_head_label

        kinds = list(SOURCE_FIGURES)
        head_layers = {parse_head_label(label)[0] for label in self.config["figures"]["heads"]}
        if not self.token_profiles(source) or not head_layers & set(self.source_layers(source)):
            kinds = [kind for kind in kinds if kind not in TOKEN_FIGURES]
        if not self.config["diagnostics"].get("reference_labels"):
            kinds = [kind for kind in kinds if kind not in LABEL_FIGURES]
        return kinds

    def figure_targets(self) -> list[str]:
        paths = []
        for source in self.sources:
            for kind in self.figure_kinds(source):
                paths += [path("source_figure", source=source, kind=kind, ext=ext) for ext in ("svg", "png")]
            for layer in self.source_layers(source):
                for kind in LAYER_FIGURES:
                    paths += [
                        path("layer_figure", source=source, layer=layer, kind=kind, ext=ext) for ext in ("svg", "png")
                    ]
        for checkpoint in self.checkpoints:
            for kind in self.checkpoint_figure_kinds(checkpoint):
                paths += [
                    path("checkpoint_figure", checkpoint=checkpoint, kind=kind, ext=ext) for ext in ("svg", "png")
                ]
        for kind in self.study_figure_kinds():
            paths += [path("study_figure", kind=kind, ext=ext) for ext in ("svg", "png")]
        return paths

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

    def summary_figures(self) -> dict[str, dict[str, str]]:
        """The figures the summary page shows beside its tables: per source, its overview
        figures (SVG); per checkpoint, its block-by-block sink mass."""
        shown = [kind for kind in SUMMARY_FIGURES if kind in SOURCE_FIGURES]
        figures = {
            source: {
                kind: path("source_figure", source=source, kind=kind, ext="svg")
                for kind in shown
                if kind in self.figure_kinds(source)
            }
            for source in self.sources
        }
        for checkpoint in self.checkpoints:
            for kind in self.checkpoint_figure_kinds(checkpoint):
                if kind in SUMMARY_FIGURES:
                    figures.setdefault(checkpoint, {})[kind] = path(
                        "checkpoint_figure", checkpoint=checkpoint, kind=kind, ext="svg"
                    )
        return figures

    def summary_figure_paths(self) -> list[str]:
        return [p for figures in self.summary_figures().values() for p in figures.values()]

    def all_targets(self) -> list[str]:
        """Everything the study makes, intermediate results included: Snakemake does not
        rebuild a missing intermediate whose consumers are up to date, and a result
        moved aside as damaged must come back on the next run."""
        tables = [path("table", table=t) for t in (*TABLES, "token_profiles")]
        per_source = [p for source in self.sources for p in self.source_tables(source).values()]
        per_source += [path("head_classes_csv", source=source) for source in self.sources]
        inputs = self.all_extract_dirs() + [path("imported", source=name) for name in self.legacy]
        embeddings = sorted(
            {
                file
                for checkpoint in self.checkpoints
                for prompt in self.prompts
                for file in self.embeddings(checkpoint, prompt)
            }
        )
        effects = [path("effects_table", checkpoint=c, table=t) for c in self.checkpoints for t in EFFECT_TABLES]
        effects += [path("table", table=t) for t in EFFECT_TABLES]
        tables += effects if self.effect_variants else []
        classes = [path("intervention_classes", checkpoint=c) for c in self.class_checkpoints]
        from sinkscope.pipeline.videoplan import video_targets

        return (
            tables
            + per_source
            + inputs
            + embeddings
            + classes
            + self.figure_targets()
            + [PATTERNS["summary"]]
            + video_targets(self)
        )

    # -- edits that select heads by class (sinkscope.interventions, pipeline.headclasses) ----------

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
        return [path("intervention_classes", checkpoint=self.checkpoint_of(source))]

    def head_classes_diagnostics(self, checkpoint: str) -> str:
        """The table the checkpoint's head classes come from: its default run's head_diagnostics."""
        return path("source_table", source=self.source_name(checkpoint, DEFAULT_VARIANT), table="head_diagnostics")

    # -- variant effects (sinkscope.pipeline.effects) ------------------------------------------------

    @property
    def effect_variants(self) -> list[str]:
        """The variants paired with the untouched run: every one but ``default``, when the
        study has ``default`` and at least one other (else none)."""
        others = [variant for variant in self.variants if variant != DEFAULT_VARIANT]
        return others if DEFAULT_VARIANT in self.variants else []

    def effects_inputs(self, checkpoint: str) -> list[str]:
        """The extraction folders of the checkpoint's default and paired variants, and the
        head classes file when an edit selects heads by class."""
        sources = [self.source_name(checkpoint, v) for v in (DEFAULT_VARIANT, *self.effect_variants)]
        inputs = [folder for source in sources for folder in self.extract_dirs(source)]
        if checkpoint in self.class_checkpoints:
            inputs.append(path("intervention_classes", checkpoint=checkpoint))
        return inputs

    def effects_params(self, checkpoint: str) -> dict[str, Any]:
        """The checkpoint and each paired variant's edits (canonical config form)."""
        edits = {
            v: self.options[self.source_name(checkpoint, v)].to_dict().get("interventions", [])
            for v in self.effect_variants
        }
        return {"checkpoint": checkpoint, "interventions": edits}

    # -- rule params (canonical: equivalent configs give equal params) -----------------------------

    def compute(self, checkpoint: str) -> dict[str, str]:
        """Device and dtype the extraction computes in (precision is provenance)."""
        return {"device": self.device, "dtype": default_dtype(self.device, self.checkpoints[checkpoint].spec.dtype)}

    def extract_params(self, source: str, group: str) -> dict[str, Any]:
        checkpoint, variant = self.runs[source]
        capture = self.config["capture"]
        resolved = self.checkpoints[checkpoint]
        # train_step only orders a figure; format 'auto' and the format it detects are one.
        spec = {**resolved.spec.to_dict(), "format": resolved.format}
        spec.pop("train_step", None)
        return {
            "checkpoint": spec,
            "variant": variant,
            "layers": decode_layers(group),
            "generation": self.options[source].to_dict(),
            "capture": {
                **{key: capture[key] for key in ("backend", "attention", "kernels", "compile", "token_profiles")},
                # Only where a study narrows it: a job of every statistic keeps the params it had.
                **(
                    {"statistics": list(capture["statistics"])}
                    if tuple(capture["statistics"]) != CAPTURE_STATISTICS
                    else {}
                ),
            },
            "compute": self.compute(checkpoint),
        }

    def aggregate_params(self, source: str) -> dict[str, Any]:
        options = self.options.get(source)
        return {
            "name": source,
            "sink_frames": options.sink_frames if options is not None else 0,
            "diagnostics": {k: v for k, v in self.config["diagnostics"].items() if k != "reference_labels"},
        }

    def figure_options(self, kind: str, source: str | None = None) -> dict[str, Any]:
        """Only the options figure ``kind`` draws with (the registry says which): changing
        another reruns nothing. ``summary`` is the report page. A kind that draws with
        ``generation`` gets ``source``'s resolved generation options."""
        options = self.config["figures"]
        chosen: dict[str, Any] = {name: options[name] for name in COMMON_OPTIONS}
        if kind == "summary":
            chosen.update(step=options["step"], metric=options["metric"])
            chosen["checkpoints"] = {
                name: {"format": c.format, "weights": c.spec.weights, "model": c.spec.model}
                for name, c in self.checkpoints.items()
            }
            chosen["legacy_caches"] = {name: {"path": str(entry["path"])} for name, entry in self.legacy.items()}
            chosen["diagnostics"] = dict(self.config["diagnostics"])
            chosen["figures"] = self.summary_figures()
            return chosen
        drawn = FIGURES[kind].options
        chosen.update((name, options[name]) for name in DRAWING_OPTIONS if name in drawn)
        if "heads" in chosen:
            chosen["heads"] = list(chosen["heads"])
        if "generation" in FIGURES[kind].extra_options and source in self.options:
            chosen["generation"] = self.options[source].to_dict()
        return chosen

    @staticmethod
    def code(stage: str) -> str:
        """Digest of the package code a stage runs (a rule param: changed code reruns it)."""
        return stage_digest(stage)
