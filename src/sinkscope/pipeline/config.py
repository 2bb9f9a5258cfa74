"""The pipeline config's checks: every problem at once (names, the schema through
``pipeline.configschema``, then the semantic checks of the sections that passed), and a
variant's generation options. What this machine can run is ``pipeline.machinecheck``.

Every error names the config key and the offending value, so a bad config is
rejected before any job runs. Snakemake's ``--config 'layers=[0,1,2]'`` delivers list
items (and nested values) as strings; values are coerced to the schema's types first,
and rejected only when they cannot be.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinkscope.errors import ConfigError, SinkscopeError
from sinkscope.interventions import LogitBias
from sinkscope.labels import read_label_file
from sinkscope.model.checkpoints import (
    WAN_VAE_FILES,
    ResolvedCheckpoint,
    checkpoint_specs,
    find_vae,
    resolve_checkpoint,
    vae_candidates,
)
from sinkscope.model.weightfiles import PACKAGE_PREFIX
from sinkscope.names import folded_collisions, name_problem, variant_name_problem
from sinkscope.naming import parse_head_label
from sinkscope.options import (
    GLOBAL,
    POLICY_KEYS,
    GenerationOptions,
    OptionsError,
    missing_reencode_vae,
    procedure_spec,
)
from sinkscope.pipeline.configfile import read_config_file
from sinkscope.pipeline.configschema import coerce, fill_defaults, finite_problems, schema_problems
from sinkscope.pipeline.layout import results_folder
from sinkscope.pipeline.overrides import apply_overrides, parse_config_overrides
from sinkscope.prompt_schedules import prompt_segments, schedule_problems, switch_frames
from sinkscope.schema import load_schema
from sinkscope.sweeps import (
    HEAD,
    Sweep,
    SweepExpansion,
    atlas_count_problems,
    expand_sweeps,
    parse_sweeps,
    sweep_message,
)

# capture.statistics: every frame statistic (the default), and those capture.attention 'frames'
# gives (sinkscope.stats.segments, which needs torch, names the same).
CAPTURE_STATISTICS = ("logit_mean", "prob_mass", "argmax_share", "entropy")
FRAMES_ROUTE_STATISTICS = ("logit_mean", "prob_mass")

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "apply_overrides",
    "checkpoint_sweeps",
    "checked_config",
    "coerce",
    "generation_options",
    "load_config",
    "normalize_config",
    "parse_config_overrides",
    "resolve_checkpoints",
    "variant_names",
]

# Sections whose keys are names the user chose (they become file and folder names; a
# variant's may be <sweep>/<item>, two nested folders).
NAMED_SECTIONS = ("checkpoints", "prompts", "legacy_caches", "variants", "sweeps")

# The study the workflow runs when no --configfile is given (a path in the working directory).
DEFAULT_CONFIG_FILE = "config.yaml"


# -- semantic checks -----------------------------------------------------------------


def _name_problems(raw: Mapping) -> list[tuple[str, str]]:
    """Names become file and folder names and Snakemake wildcard values: every name the
    user chose (``names.name_problem``, the one rule), each prompt id a legacy cache's
    rows get, the file a ``sinkscope:<file>`` weights or adapter names in the package, and
    the results folder (``layout.results_folder``), as (section, one line)."""
    problems = []
    for section in NAMED_SECTIONS:
        entries = raw.get(section)
        if isinstance(entries, Mapping):
            for key in entries:
                problem = variant_name_problem(key) if section == "variants" else name_problem(key)
                if problem is not None:
                    # A name that is not a string leaves the section out of the later checks.
                    problems.append((section if not isinstance(key, str) else "", f"config key {section}: {problem}"))
    checkpoints = raw.get("checkpoints")
    for name, entry in checkpoints.items() if isinstance(checkpoints, Mapping) else ():
        for key in ("weights", "lora"):
            value = entry.get(key) if isinstance(entry, Mapping) else None
            value = value.get("path") if isinstance(value, Mapping) else value
            if isinstance(value, str) and value.startswith(PACKAGE_PREFIX) and len(value) > len(PACKAGE_PREFIX):
                problem = name_problem(value[len(PACKAGE_PREFIX) :])
                if problem is not None:  # a file shipped in the package is named, not reached by a path
                    problems.append(("checkpoints", f"config key checkpoints.{name}.{key}: {value!r}: {problem}"))
    legacy = raw.get("legacy_caches")
    for name, entry in legacy.items() if isinstance(legacy, Mapping) else ():
        prompt_id = entry.get("prompt_id") if isinstance(entry, Mapping) else None
        if prompt_id is not None and isinstance(name, str):
            problem = name_problem(prompt_id)
            if problem is not None:
                problems.append(("", f"config key legacy_caches.{name}.prompt_id: {problem}"))
    if raw.get("results") is not None:  # the folder every result path starts with
        try:
            results_folder(raw["results"])
        except ConfigError as error:
            problems += [("", line) for line in error.problems]
    return problems


def _case_collisions(config: Mapping, invalid: set[str]) -> list[str]:
    """Names that differ only in letter case are one folder on macOS and Windows: sources
    (checkpoints and legacy caches), prompts, and variants (with ``default``, which the
    study may add, and the sweeps, whose runs are folders ``<sweep>/<item>``)."""
    problems = []
    groups = {}
    if not invalid & {"checkpoints", "legacy_caches"}:
        groups["checkpoints"] = [*config["checkpoints"], *config["legacy_caches"]]
    if "prompts" not in invalid:
        groups["prompts"] = list(config["prompts"])
    if not invalid & {"variants", "generation", "sweeps"}:
        groups["variants"] = [*variant_names(config), *config.get("sweeps", {})]
    for section, names in groups.items():
        for first, second in folded_collisions(names):
            problems.append(
                f"config key {section}: {first!r} and {second!r} differ only in letter case, and are one folder on "
                "the file systems of macOS and Windows; rename one"
            )
    return problems


def merge_variant(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A variant's ``generation:`` mapping: the base with the variant's keys on top.

    A variant that names a ``cache_policy`` starts that policy afresh: the base's window
    keys (``local_attn_frames`` ...) belong to the base's policy and are dropped unless
    the variant restates them; so does a variant that names another ``procedure``
    without a policy (the base's policy goes too). A variant that sets window keys without a policy over a
    ``global`` base means the older keys' policy (a window is ``window``, with sinks
    ``sink``). ``null`` removes a key: the policy's default applies (a window key the
    policy reads is refused at null by ``generation_options``: null is not "none" there).
    """
    data = dict(base)
    procedure = overrides.get("procedure")
    if procedure is not None and procedure != data.get("procedure") and overrides.get("cache_policy") is None:
        # Another procedure brings its own cache (rolling_forcing), or the older keys' one.
        data = {k: v for k, v in data.items() if k not in (*POLICY_KEYS, "cache_policy")}
    if overrides.get("cache_policy") is not None:
        data = {k: v for k, v in data.items() if k not in POLICY_KEYS}
    elif any(overrides.get(k) is not None for k in POLICY_KEYS) and data.get("cache_policy") in (None, GLOBAL):
        data.pop("cache_policy", None)
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def generation_options(
    config: Mapping,
    variant: str | None = None,
    checkpoint: str | None = None,
    entry: Mapping[str, Any] | None = None,
) -> GenerationOptions:
    """The resolved options of the config's generation: the study's ``generation:``, then
    the checkpoint's own ``generation:`` (its inference settings), then the variant's
    (``entry``: a swept variant's, which ``variants:`` does not hold)."""
    data = dict(config["generation"])
    layers = []
    own = (config["checkpoints"].get(checkpoint) or {}).get("generation") if checkpoint is not None else None
    if own:
        data = merge_variant(data, own)
        layers.append((f"checkpoints.{checkpoint}.generation", own))
    if entry is None and variant is not None:
        entry = config.get("variants", {}).get(variant)
    if entry is not None:
        data = merge_variant(data, entry)
        layers.append((f"variants.{variant}", entry))
    # Window keys an override sets to null (the options refuse them where the policy reads them).
    cleared = {key for _, values in layers for key in POLICY_KEYS if key in values and values[key] is None}
    try:
        return GenerationOptions.from_config(data, cleared=cleared)
    except OptionsError as exc:
        raise OptionsError(_rekey(str(exc), layers)) from None


def _rekey(message: str, layers: list[tuple[str, Mapping[str, Any]]]) -> str:
    """A generation error's key, named where the offending value was set: the variant's
    overrides, else the checkpoint's, else the last layer of overrides there is."""
    match = re.search(r"config key generation\.(\w+)", message)
    if not layers or match is None:
        return message
    where = next((name for name, values in reversed(layers) if match.group(1) in values), layers[-1][0])
    return message.replace("config key generation.", f"config key {where}.")


def prompt_switches(config: Mapping) -> dict[str, list[int]]:
    """Prompt id -> the frames where its prompt switches (empty for a single prompt)."""
    return {prompt: switch_frames(prompt_segments(entry)) for prompt, entry in config["prompts"].items()}


def variant_names(config: Mapping) -> list[str]:
    """The study's generation variants: the ``variants:`` names, or ``default``. When a
    variant sets ``interventions`` (or the study has ``sweeps:``) and none is named
    ``default``, ``default`` (the study's generation, untouched) comes first: every edited
    run has its paired control. A sweep's variants are each checkpoint's own
    (``checkpoint_sweeps``)."""
    variants = config.get("variants") or {}
    names = list(variants)
    edited = any((entry or {}).get("interventions") for entry in variants.values()) or bool(config.get("sweeps"))
    if "default" not in variants and edited:
        names.insert(0, "default")
    return names or ["default"]


def _run_name(config: Mapping, checkpoint: str, variant: str) -> str:
    """ " (checkpoint 'x', variant 'v')": which run a problem belongs to, where runs differ
    (checkpoints with generation settings of their own, variants); nothing otherwise."""
    parts = []
    if any((entry or {}).get("generation") for entry in config["checkpoints"].values()):
        parts.append(f"checkpoint {checkpoint!r}")
    if config.get("variants"):
        parts.append(f"variant {variant!r}")
    return f" ({', '.join(parts)})" if parts else ""


def _where(config: Mapping, checkpoint: str, variant: str, key: str) -> str:
    """The config key a generation key of this run was set under."""
    if config.get("variants") and key in config["variants"].get(variant, {}):
        return f"variants.{variant}.{key}"
    if key in ((config["checkpoints"][checkpoint] or {}).get("generation") or {}):
        return f"checkpoints.{checkpoint}.generation.{key}"
    return f"variants.{variant}.{key}" if config.get("variants") else f"generation.{key}"


def _check_prompts(config: Mapping, options: Mapping[tuple[str, str], GenerationOptions]) -> list[str]:
    """Blank prompts; schedules whose segments do not start at frame 0, do not increase, or
    lie past the video or off a block start, under any run's generation; a re-cache the
    cache policy cannot do."""
    problems = []
    for prompt_id, entry in config["prompts"].items():
        segments = prompt_segments(entry)
        for index, segment in enumerate(segments):
            key = f"prompts.{prompt_id}" if isinstance(entry, str) else f"prompts.{prompt_id}[{index}].text"
            if not segment.text.strip():
                problems.append(f"config key {key}: the prompt is empty or only white space")
        if isinstance(entry, str):
            continue
        for (checkpoint, variant), option in options.items():
            run = _run_name(config, checkpoint, variant)
            for index, problem in schedule_problems(segments, option):
                problems.append(f"config key prompts.{prompt_id}[{index}].start_frame: {problem}{run}")
            switches = switch_frames(segments)
            try:
                option.check_prompt_switches(switches)
            except OptionsError as exc:
                key = re.search(r"config key generation\.(\w+)", str(exc)).group(1)
                where = _where(config, checkpoint, variant, key)
                text = str(exc).replace(f"config key generation.{key}", f"config key {where}")
                problems.append(f"{text} (prompt {prompt_id!r} switches at frame {switches[0]})")
    return problems


def _check_intervention_places(config: Mapping) -> list[str]:
    """Edits belong in variants other than ``default``: the study's generation, a
    checkpoint's own and the ``default`` variant are the untouched control."""
    places = [("generation", config["generation"])]
    places += [
        (f"checkpoints.{name}.generation", (entry or {}).get("generation") or {})
        for name, entry in config["checkpoints"].items()
    ]
    places.append(("variants.default", (config.get("variants") or {}).get("default") or {}))
    return [
        f"config key {where}.interventions: edits belong in variants: (each edited variant is paired with the "
        "untouched default variant of the same checkpoint, prompt and seed); move them under "
        "variants.<name>.interventions"
        for where, values in places
        if values.get("interventions")
    ]


def _check_edited_heads(
    config: Mapping, checkpoint: str, variant: str, option: GenerationOptions, model_config, where: str | None = None
) -> list[str]:
    """Heads and layers of the run's edits that its checkpoint's model does not have
    (``where``: the key the edits were given under, if not the config's own)."""
    problems = []
    where = where or _where(config, checkpoint, variant, "interventions")
    model = (config["checkpoints"][checkpoint] or {}).get("model")
    shape = f"{model_config.num_layers} layers, {model_config.num_heads} heads"
    for index, edit in enumerate(option.interventions):
        heads = getattr(edit, "heads", None)
        missing = heads.problems(model_config.num_layers, model_config.num_heads) if heads is not None else []
        if missing:
            what = "a head" if "H" in missing[0] else "a layer"
            owner = f"{model} (checkpoint {checkpoint!r}: {shape})" if model else f"checkpoint {checkpoint!r} ({shape})"
            problems.append(f"config key {where}[{index}].heads: {missing[0]} is not {what} of {owner}")
    return problems


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _check_semantics(
    config: dict, base_dir: Path, invalid: set[str]
) -> tuple[dict[str, ResolvedCheckpoint], list[str], bool]:
    """The checks past the schema: (the checkpoints resolved, every problem, whether every
    run's generation options were built). A check runs only over sections the schema and
    the name rule left whole (``invalid`` names the others), so one bad key does not hide a
    missing file; a check that needs a part that failed (a checkpoint that did not resolve,
    a run whose options do not build) is skipped for it."""

    def whole(*sections: str) -> bool:
        return not invalid.intersection(sections)

    problems: list[str] = []
    options: dict[tuple[str, str], GenerationOptions] = {}
    runs_whole = whole("generation", "checkpoints", "variants")
    if runs_whole:
        for checkpoint in config["checkpoints"]:
            for variant in variant_names(config):
                try:
                    options[(checkpoint, variant)] = generation_options(config, variant, checkpoint)
                except OptionsError as exc:
                    problems += exc.problems
                    runs_whole = False
    for (checkpoint, variant), option in options.items():
        steps = list(option.denoising_steps)
        if any(later >= earlier for earlier, later in zip(steps, steps[1:])):
            where = _where(config, checkpoint, variant, "denoising_steps")
            problems.append(f"config key {where}: {steps} must decrease strictly (noisiest first)")
        first = list(option.first_block_denoising_steps or ())
        if any(later >= earlier for earlier, later in zip(first, first[1:])):
            where = _where(config, checkpoint, variant, "first_block_denoising_steps")
            problems.append(f"config key {where}: {first} must decrease strictly (noisiest first)")
        if not _FLOAT32_NORMAL_MIN <= option.timestep_shift <= _FLOAT32_MAX:
            where = _where(config, checkpoint, variant, "timestep_shift")
            problems.append(
                f"config key {where}: {option.timestep_shift!r} makes the denoising schedule non-finite (it is "
                f"computed in float32: use a value from {_FLOAT32_NORMAL_MIN:.1e} to {_FLOAT32_MAX:.1e}; "
                "Self-Forcing's is 5.0)"
            )
    for (checkpoint, variant), option in options.items():
        problems += _check_edit_values(_where(config, checkpoint, variant, "interventions"), option)
    if whole("prompts"):
        _one_segment_prompts_as_text(config)
        problems += _check_prompts(config, options)
    if whole("generation", "checkpoints", "variants"):
        problems += _check_intervention_places(config)
        problems += _check_empty_interventions(config)
    problems += _case_collisions(config, invalid)
    if whole("capture"):
        capture = config["capture"]
        if capture["attention"] == "fused" and capture["backend"] == "torch":
            problems.append(
                "config key capture.attention: 'fused' is a Triton kernel's, and capture.backend 'torch' computes "
                "SDPA, then the reference; use backend auto or triton, or attention exact"
            )
        beyond_frames = [name for name in capture["statistics"] if name not in FRAMES_ROUTE_STATISTICS]
        if capture["attention"] == "frames" and beyond_frames:
            problems.append(
                f"config key capture.statistics: {list(capture['statistics'])} asks for "
                f"{', '.join(beyond_frames)}, which capture.attention "
                "'frames' does not give (it gives logit_mean and prob_mass: the others need the scores); "
                "use attention exact or fused, or statistics [logit_mean, prob_mass]"
            )
    if whole("diagnostics"):
        first_k = config["diagnostics"]["first_k"]
        for (checkpoint, variant), option in options.items():
            if first_k > option.num_frames:
                problems.append(
                    f"config key diagnostics.first_k: {first_k} frames are more than the {option.num_frames} frames"
                    + _run_name(config, checkpoint, variant)
                )

    heads = []
    if whole("figures"):
        for label in config["figures"]["heads"]:
            try:
                heads.append((label, *parse_head_label(label)))
            except ConfigError as exc:
                problems += exc.problems

    resolved: dict[str, ResolvedCheckpoint] = {}
    model_shapes: dict[str, tuple[int, int]] = {}
    specs = {}
    if whole("checkpoints"):
        for name in config["checkpoints"]:
            try:
                specs[name] = checkpoint_specs({"checkpoints": {name: config["checkpoints"][name]}})[name]
            except ConfigError as exc:
                problems += exc.problems
    sweeps, sweep_lines = _parsed_sweeps(config) if whole("sweeps", "variants") else ({}, [])
    problems += sweep_lines
    for name, spec in specs.items():
        try:
            resolved[name] = checkpoint = resolve_checkpoint(spec, base_dir)
        except ConfigError as exc:
            problems += exc.problems
            continue
        model_config = checkpoint.model_config
        model_shapes[name] = (model_config.num_layers, model_config.num_heads)
        if sweeps and (name, "default") in options:
            problems += _check_swept_runs(config, sweeps, name, model_config)
        for (owner, variant), option in options.items():
            if owner != name:
                continue
            where = _where(config, name, variant, "latent_height").rsplit(".", 1)[0]
            try:
                model_config.frame_seq_length(option.latent_height, option.latent_width)
            except ValueError as exc:
                problems.append(f"config key {where}.latent_height/latent_width: {exc}")
                runs_whole = False
            if procedure_spec(option.procedure).needs_vae(option) and find_vae(checkpoint) is None:
                problems.append(
                    missing_reencode_vae(
                        _where(config, name, variant, "recompute_context"),
                        f"checkpoint {name!r}'s",
                        "Wan2.1_VAE.pth or vae/ in its base folder",
                    )
                )
        chosen_layers = [("layers", config["layers"])] if whole("layers") else []
        if whole("figures"):
            chosen_layers.append(("figures.highlight_layers", config["figures"]["highlight_layers"]))
        for key, chosen in chosen_layers:
            bad_layers = [layer for layer in chosen or [] if layer >= model_config.num_layers]
            if bad_layers:
                problems.append(
                    f"config key {key}: {bad_layers} do not exist in checkpoint {name!r} "
                    f"(model has layers 0..{model_config.num_layers - 1})"
                )
        for (owner, variant), option in options.items():
            if owner == name:
                problems += _check_edited_heads(config, name, variant, option, model_config)
        for label, layer, head in heads:
            if layer >= model_config.num_layers or head >= model_config.num_heads:
                problems.append(
                    f"config key figures.heads: {label!r} does not exist in checkpoint {name!r} "
                    f"({model_config.num_layers} layers x {model_config.num_heads} heads)"
                )
        if whole("outputs") and config["outputs"]["video"]:
            problems += [line for line in [missing_vae(name, checkpoint)] if line]
    if whole("figures"):
        step = config["figures"]["step"]
        for (checkpoint, variant), option in options.items():
            if isinstance(step, int) and step >= len(option.denoising_steps):
                problems.append(
                    f"config key figures.step: {step} is past the last denoising step {len(option.denoising_steps) - 1}"
                    + _run_name(config, checkpoint, variant)
                )
    if whole("diagnostics"):
        problems += _check_reference_labels(config["diagnostics"].get("reference_labels"), base_dir, model_shapes)
    if whole("legacy_caches"):
        for name, entry in config["legacy_caches"].items():
            path = Path(entry["path"])
            if not (path if path.is_absolute() else base_dir / path).is_file():
                problems.append(f"config key legacy_caches.{name}.path: file {entry['path']!r} does not exist")
            if whole("checkpoints") and name in config["checkpoints"]:
                problems.append(f"config key legacy_caches.{name}: the name is also a checkpoint; names must differ")
    return resolved, _unique(problems), runs_whole


def _parsed_sweeps(config: Mapping) -> tuple[dict[str, Sweep], list[str]]:
    """The study's sweeps (``sweeps.parse_sweeps``) and the problems of them: each one line;
    a sweep whose name the name rule refused is left to that rule's line; a sweep over
    heads chosen by class (``class:``, ``random:``), whose runs exist only once the
    untouched run's classes do, is refused: the workflow plans every run before it starts."""
    entries = {name: entry for name, entry in config.get("sweeps", {}).items() if name_problem(name) is None}
    try:
        sweeps = parse_sweeps(entries, config.get("variants") or {})
    except ConfigError as error:
        return {}, error.problems
    problems = [
        f"config key sweeps.{name}.over: {sweep.over.to_config()!r} chooses heads by the untouched run's classes, "
        "which exist only after it ran, and the workflow plans every run of a sweep before it starts; write over: "
        "all, or list the heads (its head_classes.csv names each head's class)"
        for name, sweep in sweeps.items()
        if sweep.needs_classes
    ]
    return ({} if problems else sweeps), problems


def checkpoint_sweeps(
    config: Mapping, sweeps: Mapping[str, Sweep], checkpoint: str, model_config: Any
) -> SweepExpansion:
    """The swept variants of one checkpoint (``sweeps.expand_sweeps``): its model's layers
    and heads, its untouched run's blocks and sink frames."""
    default = generation_options(config, "default", checkpoint)
    return expand_sweeps(
        sweeps,
        num_layers=model_config.num_layers,
        num_heads=model_config.num_heads,
        block_sizes=default.block_sizes(),
        sink_frames=default.sink_frames,
    )


def _check_swept_runs(config: Mapping, sweeps: Mapping[str, Sweep], checkpoint: str, model_config: Any) -> list[str]:
    """Every check of a hand-written variant on each swept run of ``checkpoint`` (its edits
    build, mean something and fit the model), each problem said of the sweep
    (``sweep_message``) once, with the first run it concerns and how many more."""
    try:
        expansion = checkpoint_sweeps(config, sweeps, checkpoint, model_config)
    except ConfigError as error:
        return error.problems
    head_sweeps = {name: expansion.counts[name] for name, sweep in sweeps.items() if sweep.axis == HEAD}
    problems = atlas_count_problems(config.get("variants") or {}, head_sweeps)
    found: dict[str, tuple[str, list[str]]] = {}
    for variant, entry in expansion.variants.items():
        try:
            option = generation_options(config, variant, checkpoint, entry)
        except OptionsError as error:
            lines = error.problems
        else:
            where = f"variants.{variant}.interventions"
            lines = _check_edit_values(where, option)
            lines += _check_edited_heads(config, checkpoint, variant, option, model_config, where=where)
        for line in lines:
            said = sweep_message(line, list(sweeps)).rsplit(" (run ", 1)[0]
            # One line a key: the first run's words, and how many runs more it concerns.
            found.setdefault(said.split(": ", 1)[0], (said, []))[1].append(variant)
    return problems + [
        f"{line} (run {runs[0]}" + (f", and {len(runs) - 1} more" if len(runs) > 1 else "") + ")"
        for line, runs in found.values()
    ]


def _check_edit_values(where: str, option: GenerationOptions) -> list[str]:
    """Edits that mean nothing or overflow: one given twice (biases on the same head and
    frame add up: sinkscope.model.generation_edits), a bias whose edited scores overflow after the
    softmax's max shift (``LOGIT_BIAS_LIMIT``), alone or added up with the others."""
    problems = []
    seen: dict[str, int] = {}
    for index, edit in enumerate(option.interventions):
        canonical = json.dumps(edit.to_config(), sort_keys=True)
        if canonical in seen:
            again = "give the sum of the biases in one edit" if isinstance(edit, LogitBias) else "give it once"
            problems.append(f"config key {where}[{index}]: the same edit as [{seen[canonical]}] ({again})")
        seen.setdefault(canonical, index)
        if isinstance(edit, LogitBias) and abs(edit.bias) > LOGIT_BIAS_LIMIT:
            problems.append(f"config key {where}[{index}].bias: {edit.bias!r} {_BIAS_OVERFLOWS}")
    biases = [edit.bias for edit in option.interventions if isinstance(edit, LogitBias)]
    total = math.fsum(abs(bias) for bias in biases)
    if len(biases) > 1 and total > LOGIT_BIAS_LIMIT and all(abs(bias) <= LOGIT_BIAS_LIMIT for bias in biases):
        problems.append(
            f"config key {where}: the logit_bias edits' biases add up to {total:.3g}, which {_BIAS_OVERFLOWS}"
        )
    return problems


def _check_empty_interventions(config: Mapping) -> list[str]:
    """``interventions: []`` edits nothing: a variant that says so is the untouched run,
    which the study has already (``default``); refused rather than run twice."""
    places = [("generation", config["generation"])]
    places += [
        (f"checkpoints.{name}.generation", (entry or {}).get("generation") or {})
        for name, entry in config["checkpoints"].items()
    ]
    places += [(f"variants.{name}", entry or {}) for name, entry in (config.get("variants") or {}).items()]
    return [
        f"config key {where}.interventions: an empty list edits nothing (this would be the untouched run, which "
        "the study's default variant is already); list the edits, or leave the key out"
        for where, values in places
        if isinstance(values.get("interventions"), list) and not values["interventions"]
    ]


def _check_reference_labels(
    reference: str | None, base_dir: Path, model_shapes: Mapping[str, tuple[int, int]]
) -> list[str]:
    """diagnostics.reference_labels: a label file that reads, one row per layer and a column
    per head of every checkpoint's model."""
    if not reference:
        return []
    key = "config key diagnostics.reference_labels"
    file = Path(reference) if Path(reference).is_absolute() else base_dir / reference
    if not file.is_file():
        return [f"{key}: file {reference!r} does not exist"]
    try:
        labels = read_label_file(file)
    except SinkscopeError as exc:
        return [f"{key}: {exc}"]
    shape = (len(labels), len(labels[0]))
    return [
        f"{key}: label file {reference!r} holds {shape[0]} layers x {shape[1]} heads, checkpoint {name!r} "
        f"{want[0]} x {want[1]}"
        for name, want in model_shapes.items()
        if want != shape
    ]


def normalize_config(raw: Mapping | None, base_dir: str | Path = ".") -> dict:
    """Coerce, fill defaults, validate; return the config every rule reads.

    ``base_dir`` resolves relative paths (the workflow's working directory).
    Raises ConfigError naming every problem found. The whole check, machine and files
    included, is ``sinkscope.pipeline.study.load_study``.
    """
    return checked_config(raw, base_dir)[0]


def checked_config(raw: Mapping | None, base_dir: str | Path = ".") -> tuple[dict, dict[str, ResolvedCheckpoint]]:
    """The normalized config and its checkpoints, resolved once (files found and opened);
    a ConfigError listing every problem (``check_config``) otherwise."""
    checked = check_config(raw, base_dir)
    if checked.problems:
        raise ConfigError.invalid(checked.problems)
    return checked.config, checked.resolved


@dataclass
class CheckedConfig:
    """What the config check found: the config as far as it was normalized, the
    checkpoints that resolved, every problem (one line each), and whether the checks that
    need the whole config may follow (``complete``: every section is whole and every run's
    generation options were built; the memory estimate is one such)."""

    config: dict
    resolved: dict[str, ResolvedCheckpoint]
    problems: list[str]
    complete: bool
    # The top-level sections the schema, the name rule or a non-finite number refused.
    invalid: set[str]


def check_config(raw: Mapping | None, base_dir: str | Path = ".") -> CheckedConfig:
    """Every problem of a raw config at once: names (``names.name_problem``), values that
    are not finite, the schema (types, ranges, unknown keys), then the semantic checks over
    the sections that passed (``_check_semantics``: a bad key in one section does not hide
    a missing file named in another)."""
    raw = dict(raw or {})
    named = _name_problems(raw)
    schema = load_schema()
    config = coerce(copy.deepcopy(raw), schema)
    finite = finite_problems(config)
    config = fill_defaults(config, schema)
    found = named + finite + schema_problems(config)
    invalid = {section for section, _ in found}
    problems = [line for _, line in named + finite] + sorted({line for _, line in found[len(named + finite) :]})
    if any(section not in config for section in invalid - {""}):
        return CheckedConfig(config, {}, _unique(problems), False, invalid)
    resolved, semantic, runs_whole = _check_semantics(config, Path(base_dir), invalid)
    problems = _unique(problems + semantic)
    return CheckedConfig(config, resolved, problems, runs_whole and not problems, invalid)


def _one_segment_prompts_as_text(config: dict) -> None:
    """A schedule of one segment is that segment's text: one form, one embedding file."""
    for prompt_id, entry in config["prompts"].items():
        if isinstance(entry, list) and len(entry) == 1 and entry[0]["start_frame"] == 0:
            config["prompts"][prompt_id] = entry[0]["text"]


# The largest |bias| of a logit_bias edit, and of a variant's biases added up (edits on
# the same head and frame add: sinkscope.model.generation_edits): a quarter of bfloat16's largest
# finite value (float32's is a little larger). The softmax subtracts each query's largest
# edited score, and the edited log-sum-exps are merged by their differences
# (sinkscope.attention.biased): (s_i + b_i) - (s_j + b_j) stays finite while |b_i - b_j| is
# at most twice this and the scores below it, which a model's finite scores are by far. A
# bias past about +-100 already saturates the softmax (-100 leaves a frame under 1e-43 of
# the mass; mask_keys removes it exactly), so the limit refuses only biases that overflow.
BFLOAT16_MAX = 3.3895313892515355e38
LOGIT_BIAS_LIMIT = BFLOAT16_MAX / 4
_BIAS_OVERFLOWS = (
    f"makes the edited scores overflow after the softmax's max shift (float32 and bfloat16 hold up to "
    f"{BFLOAT16_MAX:.2g}): keep |bias| at most {LOGIT_BIAS_LIMIT:.2g} (+-100 already saturates the softmax; "
    "mask_keys removes a frame exactly)"
)

# The flow-matching schedule (generation.sampler.FlowMatchSchedule) is computed in
# float32: a shift outside the normal float32 range becomes 0 or infinity there, and the
# schedule's sigmas NaN.
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_NORMAL_MIN = 1.1754943508222875e-38


def resolve_checkpoints(config: Mapping, base_dir: str | Path = ".") -> dict[str, ResolvedCheckpoint]:
    """Every checkpoint of a normalized config, resolved (files found, config read)."""
    return {name: resolve_checkpoint(spec, base_dir) for name, spec in checkpoint_specs(config).items()}


def load_config(path: str | Path, overrides: Mapping | None = None, base_dir: str | Path = ".") -> dict:
    """Read a YAML config file (plus overrides) and normalize it; paths resolve from base_dir."""
    return normalize_config(apply_overrides(read_config_file(path), overrides), base_dir=base_dir)


def missing_vae(name: str, checkpoint: ResolvedCheckpoint) -> str | None:
    """The config check's line for ``outputs.video`` and a checkpoint without a Wan VAE."""
    if find_vae(checkpoint) is not None:
        return None
    looked = ", ".join(str(p) for p in vae_candidates(checkpoint))
    name_of_file = WAN_VAE_FILES.get(checkpoint.model_config.in_dim, WAN_VAE_FILES[16])
    if not looked:
        return (
            f"config key outputs.video: checkpoint {name!r} has no Wan VAE: no release folder to look for "
            f"{name_of_file} or vae/ in (set its base to one), or set outputs.video: false"
        )
    return (
        f"config key outputs.video: checkpoint {name!r} has no Wan VAE (looked for {looked}); put {name_of_file} "
        "or a diffusers vae/ folder there, or set outputs.video: false"
    )
