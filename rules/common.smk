# Reading the config (config.yaml, or the --configfile files instead), its validation,
# the pre-run checks and the functions the rules take their inputs and params from
# (each named for what it returns). The logic lives in the sinkscope package
# (sinkscope.pipeline.config, sinkscope.pipeline.study and its planners,
# sinkscope.pipeline.integrity); this file wires it in. Nothing here imports torch.

import re
import sys

from snakemake.utils import validate

from sinkscope.errors import SinkscopeError
from sinkscope.naming import LAYER_GROUP
from sinkscope.pipeline.config import DEFAULT_CONFIG_FILE
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.integrity import quarantine, scan_results
from sinkscope.pipeline.invocation import (
    LOCAL_EXECUTORS,
    acts_on_results,
    forget_inventory,
    invocation_mode,
    requested_executor,
)
from sinkscope.pipeline.layout import BENCHMARKS, LOGS
from sinkscope.pipeline.recovery import mark_run_start, recover_interrupted_run
from sinkscope.pipeline.study import load_study
from sinkscope.pipeline.studystamp import claim_results_folder, other_study
from sinkscope.pipeline.videoplan import run_latents, sheet_inputs, sheet_params
from sinkscope.pipeline.videoplan import video_params as video_params_of
from sinkscope.schema import SCHEMA_PATH


def _reject(message):
    # One clear message and no traceback; nothing has run, so no result is touched.
    sys.stderr.write(f"sinkscope: {message}\n")
    sys.exit(1)


# The study is config.yaml, or instead only the files given with --configfile: each
# example in configs/ is a whole study, never merged into the default one. --config
# overrides go on top of either. A cluster job's re-parse gets the same --configfiles
# and --config, so it reads the same study.
if not workflow.overwrite_configfiles:
    try:
        # Read here first: a YAML mistake is named with its line and column, which
        # Snakemake's own message leaves out.
        read_config_file(DEFAULT_CONFIG_FILE)
    except SinkscopeError as error:
        _reject(error)

    configfile: DEFAULT_CONFIG_FILE


# Checks of this machine and of earlier results belong to the main Snakemake process,
# not to the re-parse inside a cluster job.
_MAIN = not (workflow.remote_exec or workflow.subprocess_exec)
# While parsing, workflow.local_exec is true even for --executor slurm (the executor is
# set up later): read the executor from the command line and profiles instead.
_LOCAL = (
    workflow.local_exec
    and not workflow.remote_exec
    and requested_executor(sys.argv, workflow.basedir) in LOCAL_EXECUTORS
)

try:
    # The one check (sinkscope check runs the same): config, files, this machine.
    STUDY = load_study(config, local=_LOCAL, check_this_machine=_MAIN, config_files=workflow.configfiles)
    config.clear()
    config.update(STUDY.config)
    # The ecosystem's check against the same schema; defaults are already filled (and a
    # variant inherits its missing keys from generation:, so none may be filled there).
    validate(config, schema=str(SCHEMA_PATH), set_default=False)
    ENCODERS = {key: encoder.to_dict() for key, encoder in STUDY.encoders.items()}
    TARGETS = STUDY.all_targets()
except SinkscopeError as error:
    _reject(error)

# Every rule writes its files under <results>, the study's results folder (config key
# results: results/ for config.yaml, results/<name>/ for each example in configs/), with
# its logs and benchmarks beside them; sinkscope.pipeline.layout lists the same patterns.
pathvars:
    results=STUDY.results,
    logs=LOGS,
    benchmarks=BENCHMARKS,


# One study a results folder: a run (or dry run) of another config file into a folder that
# records a study is refused in one line, before anything runs (sinkscope.pipeline.studystamp).
if _MAIN and acts_on_results(sys.argv):
    try:
        _other = other_study(STUDY.results, workflow.configfiles, replace=config["replace_results"])
    except SinkscopeError as error:
        _reject(error)
    if _other and invocation_mode(sys.argv) != "run":
        sys.stderr.write(f"sinkscope: a run deletes the results of {' + '.join(_other)} in {STUDY.results}/ first\n")


# A run stopped half-way (Ctrl-C, a kill, a full disk) leaves Snakemake's backups of
# update() outputs and a job's temporaries behind, which would block every later run:
# a run that will execute jobs, with no Snakemake holding this directory, resolves them
# first (sinkscope.pipeline.recovery), keeping whichever result is whole.
if _MAIN and invocation_mode(sys.argv) == "run":
    try:  # a lock this machine's stopped run did not provably leave stops the run
        for _action in recover_interrupted_run(results=STUDY.results):
            sys.stderr.write(f"sinkscope: {_action}\n")
    except SinkscopeError as error:
        _reject(error)


# A run records its study in its results folder (after a replaced study's results are
# deleted), once no stopped run's locks are left.
if _MAIN and invocation_mode(sys.argv) == "run":
    try:
        for _action in claim_results_folder(STUDY.results, workflow.configfiles, replace=config["replace_results"]):
            sys.stderr.write(f"sinkscope: {_action}\n")
    except SinkscopeError as error:
        _reject(error)


# Once this run holds its locks: record host, pid and its lock files, so that a later
# run removes them only if they are provably this machine's stopped run.
onstart:
    mark_run_start()

# Snakemake sees a result missing, never damaged (and nothing inside a directory()
# output): before any job runs, check every result that exists (folders against their
# manifests, Parquet files by checksums and digests, figures and pages by their
# structure; sinkscope.pipeline.integrity.check_result). A run that would execute jobs
# moves a damaged one aside and stops, so that the next run rebuilds it; a dry run stops
# naming it; other inspections warn.
if _MAIN:
    _damaged = scan_results(STUDY.all_targets())
    if _damaged:
        # A dry run leaves Snakemake's file inventory behind for the next run to reuse;
        # it would still list what is being moved aside.
        forget_inventory()
        _lines = "\n  ".join(problem for problems in _damaged.values() for problem in problems)
        _mode = invocation_mode(sys.argv)
        if _mode == "inspect":
            sys.stderr.write(f"sinkscope: warning: damaged results (a run moves them aside and rebuilds them):\n  {_lines}\n")
        elif _mode == "dry-run":
            _reject(f"damaged results (a real run moves them aside; the run after it rebuilds them):\n  {_lines}")
        else:
            _moved = "\n  ".join(f"{folder} -> {quarantine(folder)}" for folder in _damaged)
            _reject(
                f"damaged results:\n  {_lines}\nmoved aside (kept for a look):\n  {_moved}\n"
                "run the same snakemake command again: it rebuilds exactly those jobs and what depends on them"
            )


def names(values):
    """A wildcard constraint: exactly these names."""
    return "|".join(re.escape(str(value)) for value in sorted(values)) or "NONE"


wildcard_constraints:
    source=names(STUDY.sources),
    sweep=names({sweep for _, sweep in STUDY.ranked_atlases}),
    checkpoint=names(STUDY.checkpoints),
    prompt=names(STUDY.prompts),
    encoder=names(ENCODERS),
    seed=r"\d+",
    segment=r"\d+",
    layer=r"\d+",
    group=LAYER_GROUP,


# -- extraction (rules/extract.smk, import.smk, aggregate.smk) --------------------------------


def encoder_spec(wildcards):
    return ENCODERS[wildcards.encoder]


def encoder_sha256(wildcards):
    return STUDY.encoder_sha256(wildcards.encoder)


def encoder_gpus(wildcards):
    return 0 if ENCODERS[wildcards.encoder]["kind"] == "demo" else 1


def prompt_text(wildcards):
    return config["prompts"][wildcards.prompt]


def segment_text(wildcards):
    return STUDY.segment_text(wildcards.prompt, wildcards.segment)


def segment_starts(wildcards):
    return STUDY.segment_starts(wildcards.prompt)


def prompt_embeddings(wildcards):
    return STUDY.embeddings(STUDY.checkpoint_of(wildcards.source), wildcards.prompt)


def edit_inputs(wildcards):
    """The files a run's edits select heads by: the untouched run's head classes, head orders."""
    return STUDY.edit_inputs(wildcards.source)


def run_params(wildcards):
    return STUDY.extract_params(wildcards.source, wildcards.group)


def weights_sha256(wildcards):
    # A param, not an input: new bytes rerun the checkpoint's jobs, a mere touch does not.
    return STUDY.weights_sha256(STUDY.checkpoint_of(wildcards.source))


def generation_vae_sha256(wildcards):
    return STUDY.generation_vae_sha256(wildcards.source)


# A job of several runs (rules/extract.smk): its inputs and params, bound to the job.


def job_embeddings(job):
    return lambda wildcards: STUDY.embeddings(job.checkpoint, wildcards.prompt)


def job_params(job):
    return lambda wildcards: STUDY.job_params(job)


def job_weights_sha256(job):
    return lambda wildcards: STUDY.weights_sha256(job.checkpoint)


def job_vae_sha256(job):
    return lambda wildcards: STUDY.job_vae_sha256(job)


def extraction_resources():
    """What a job of several runs asks for: one GPU, and whatever the profile sets for
    extract_attention (set-resources: partition, memory, runtime), so that a cluster
    profile's one entry covers every extraction job."""
    chosen = {"gpu": 1}
    for name, value in workflow.resource_settings.overwrite_resources.get("extract_attention", {}).items():
        chosen[name] = getattr(value, "raw", value)
    return chosen


def legacy_cache_file(wildcards):
    return config["legacy_caches"][wildcards.source]["path"]


def legacy_cache_entry(wildcards):
    return config["legacy_caches"][wildcards.source]


def frame_inputs(wildcards):
    """A source's extraction folders, or its imported table."""
    return STUDY.source_inputs(wildcards.source)


def aggregate_params(wildcards):
    return STUDY.aggregate_params(wildcards.source)


# -- interventions, effects and atlases (rules/interventions.smk, effects.smk, atlas.smk) ---------


def untouched_head_diagnostics(wildcards):
    return STUDY.head_classes_diagnostics(wildcards.checkpoint)


def paired_runs(wildcards):
    """The extraction folders of a checkpoint's untouched run and of each variant paired with it."""
    return STUDY.effects_inputs(wildcards.checkpoint)


def effects_params(wildcards):
    return STUDY.effects_params(wildcards.checkpoint)


def atlas_effects(wildcards):
    return STUDY.atlas_inputs(wildcards.checkpoint)["effects"]


def atlas_default_runs(wildcards):
    return STUDY.atlas_inputs(wildcards.checkpoint)["default_runs"]


def atlas_head_classes(wildcards):
    return STUDY.atlas_inputs(wildcards.checkpoint)["head_classes"]


def atlas_params(wildcards):
    return STUDY.atlas_params(wildcards.checkpoint)


def head_sweep_runs(wildcards):
    """The extraction folders of a head sweep's runs and of the untouched run."""
    return STUDY.head_orders_inputs(wildcards.checkpoint, wildcards.sweep)


# -- figures (rules/figures.smk): one job draws several, each read, drawn and rerun as its own


def _inputs(figures):
    return {name: figure["inputs"] for name, figure in figures.items()}


def _params(figures):
    """Name -> kind, layer and the options it draws with (a param: changed options rerun the job)."""
    return {name: {key: figure[key] for key in ("kind", "layer", "options")} for name, figure in figures.items()}


def source_figure_tables(wildcards):
    """Kind -> the tables it reads, for each figure of a source."""
    return _inputs(STUDY.source_figures(wildcards.source))


def source_figures(wildcards):
    return _params(STUDY.source_figures(wildcards.source))


def layer_figure_tables(wildcards):
    """``layer<L>_<kind>`` -> the layer's frame rows and the source tables it reads."""
    return _inputs(STUDY.layer_figures(wildcards.source))


def layer_figures(wildcards):
    return _params(STUDY.layer_figures(wildcards.source))


def checkpoint_figure_tables(wildcards):
    return _inputs(STUDY.checkpoint_figures(wildcards.checkpoint))


def checkpoint_figures(wildcards):
    return _params(STUDY.checkpoint_figures(wildcards.checkpoint))


def study_figure_tables(wildcards):
    return _inputs(STUDY.study_figures())


def study_figures(wildcards):
    return _params(STUDY.study_figures())


def figure_code(kinds):
    """Kind -> the digest of its drawing code."""
    return {kind: STUDY.code(kind) for kind in kinds}


def train_steps(wildcards):
    return {name: checkpoint.spec.train_step for name, checkpoint in STUDY.checkpoints.items()}


def figure_output(pattern, category, subcategory, labels):
    """SVG (in the report) and PNG outputs of a figure; update(): a failed redraw keeps the old."""
    svg = report(
        pattern.replace("{ext}", "svg"),
        caption="../report/figure.rst",
        category=category,
        subcategory=subcategory,
        labels=labels,
    )
    return dict(svg=update(svg), png=update(pattern.replace("{ext}", "png")))


def figure_outputs(pattern, kinds, category, subcategory):
    """The SVG and PNG of each kind (``<kind>_svg``, ``<kind>_png``): ``pattern`` filled per kind."""
    outputs = {}
    for kind in kinds:
        drawn = figure_output(pattern.replace("{kind}", kind), category, subcategory, {"figure": kind})
        outputs.update({f"{kind}_{ext}": path for ext, path in drawn.items()})
    return outputs


def layer_figure_outputs(pattern, layers, kinds, category):
    """The SVG and PNG of each kind of each layer (``layer<L>_<kind>_svg`` ...)."""
    outputs = {}
    for layer in layers:
        for kind in kinds:
            filled = pattern.replace("{layer}", str(layer)).replace("{kind}", kind)
            drawn = figure_output(filled, category, f"Layer {layer}", {"figure": kind, "layer": str(layer)})
            outputs.update({f"layer{layer}_{kind}_{ext}": path for ext, path in drawn.items()})
    return outputs


# -- videos (rules/video.smk) ---------------------------------------------------------------------


def latents_folder(wildcards):
    return run_latents(STUDY, wildcards.source, wildcards.prompt, wildcards.seed)


def video_params(wildcards):
    return video_params_of(STUDY, wildcards.source)


def sheet_frames(wildcards):
    """The videos (outputs.video) or latents of a checkpoint's variants, one a contact-sheet row."""
    return sheet_inputs(STUDY, wildcards.checkpoint, wildcards.prompt, wildcards.seed)
