"""The ``sinkscope`` command: the pipeline's jobs and checks, runnable without Snakemake.

    sinkscope check [config.yaml] [key=value ...]   validate a config as the Snakefile does: every problem, or a verdict
    sinkscope check --results [config.yaml]          finished runs' cache contents against their policies' layouts
    sinkscope models                                 named model configs and their sizes
    sinkscope extract --layers 0 4 --out DIR         one extraction job (one generation)
    sinkscope import-cache PATH --out OUT.parquet    convert an older .pt attention cache
    sinkscope figure KIND --input FILE ... --out-prefix PATH   draw one figure
    sinkscope compare-labels --labels FILE --input head_diagnostics.parquet   a label file against the head classes
    sinkscope verify results/                        check every result file's integrity
    sinkscope findings --tables results/tables DOC   write a doc's marked numbers from a study's tables
    sinkscope train-demo --out DIR                   train the demo model on synthetic videos

Errors print one line naming the file, key or value, and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from sinkscope import __version__, arguments
from sinkscope.arguments import OUTPUT_RULE, OneLineArgumentParser, call_step, natural, output_path
from sinkscope.cli.figure import add_figure_parser
from sinkscope.errors import ConfigError, SinkscopeError
from sinkscope.schema import schema_defaults

if TYPE_CHECKING:
    pass


def _overrides(pairs: list[str], *, dotted: bool = False) -> dict:
    """key=value pairs read as snakemake --config reads them (nested: generation={num_frames: 9});
    ``dotted`` (extract --set) also takes generation.num_frames=9."""
    from sinkscope.pipeline.config import parse_config_overrides

    return parse_config_overrides(pairs, dotted=dotted)


def _study(args: argparse.Namespace, *, local: bool = True):
    """The config file plus overrides, through the Snakefile's own check (load_study)."""
    from sinkscope.pipeline.config import apply_overrides
    from sinkscope.pipeline.configfile import read_config_file
    from sinkscope.pipeline.study import load_study

    overrides = _overrides(args.overrides, dotted=args.command == "extract")
    raw = apply_overrides(read_config_file(args.config), overrides)
    if args.command == "extract" and args.layers and isinstance(raw.get("figures"), dict):
        # One job of the layers asked for, which draws no figure: the study's figure heads
        # and highlighted layers (checked against the layers it captures) do not bind them.
        raw["figures"] = {k: v for k, v in raw["figures"].items() if k not in ("heads", "highlight_layers")}
    return load_study(raw, local=local)


def cmd_check(args: argparse.Namespace) -> int:
    from sinkscope.pipeline.verdict import verdict

    study = _study(args, local=not args.cluster)
    if args.results:
        return _check_results(study)
    if args.show_config:
        print(yaml.safe_dump(_shown_config(study), sort_keys=False), end="")
    print(f"sinkscope check: {verdict(study, args.config)}", file=sys.stderr)
    return 0


def _shown_config(study) -> dict:
    """The config every rule reads, with the variants the study runs: those it adds
    (``default``, the untouched run paired with edited variants) shown as the empty
    variant they are (the study's generation, unchanged)."""
    config = dict(study.config)
    configured = config.get("variants") or {}
    names = [*study.variants, *(name for name in configured if name not in study.variants)]  # atlas runs last
    config["variants"] = {name: dict(configured.get(name) or {}) for name in names}
    return config


def _check_results(study) -> int:
    """``check --results``: the study's finished extraction folders against the cache
    layouts their policies declare; one line a contradicting call, exit status 1 if any."""
    from sinkscope.pipeline.cachecheck import check_study_results

    planned = study.all_extract_dirs()
    checked, lines = check_study_results(planned)
    for line in lines:
        print(line)
    print(
        f"# {checked} of {len(planned)} extraction folders finished and checked: "
        f"{len(lines) or 'no'} calls contradict their cache policy's layout",
        file=sys.stderr,
    )
    return 1 if lines else 0


def cmd_models(args: argparse.Namespace) -> int:
    from sinkscope.model import MODEL_CONFIGS
    from sinkscope.pipeline.resources import parameter_count

    for name, config in MODEL_CONFIGS.items():
        print(
            f"{name}: {config.num_layers} layers x {config.num_heads} heads, dim {config.dim}, "
            f"{parameter_count(config) / 1e6:.1f}M parameters, {config.frame_seq_length()} tokens a frame "
            f"({config.latent_height}x{config.latent_width} latents)"
        )
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from sinkscope.model.text import encode_prompts, save_embedding
    from sinkscope.pipeline.extract import extract_job
    from sinkscope.pipeline.jobs import log_to, pick_device

    log_to(None)
    _check_output(
        Path(args.out),
        inputs=[Path(args.config)],
        force=args.force,
        ours=_is_extraction_folder,
        what="an extraction folder",
    )
    # The chosen layers and seed go through the study's own check (layers within the model,
    # seeds within int64), before any weights are loaded.
    if args.layers:
        args.overrides = [*args.overrides, f"layers={list(args.layers)}"]
    if args.seed is not None:
        args.overrides = [*args.overrides, f"seeds=[{args.seed}]"]
    study = _study(args)
    config = study.config
    name = args.checkpoint or next(iter(config["checkpoints"]))
    if name not in config["checkpoints"]:
        raise ConfigError(f"checkpoint {name!r} is not in the config (known: {', '.join(config['checkpoints'])})")
    variant = args.variant or study.variants[0]
    if variant not in study.variants_of(name):
        known = study.variants + ([f"<sweep>/<item> of {', '.join(study.sweeps)}"] if study.sweeps else [])
        raise ConfigError(f"variant {variant!r} is not in the config (known: {', '.join(known)})")
    prompt_id = args.prompt or next(iter(config["prompts"]))
    if prompt_id not in config["prompts"]:
        raise ConfigError(f"prompt {prompt_id!r} is not in the config (known: {', '.join(config['prompts'])})")
    layers = study.layers
    out = Path(args.out)
    encoder = study.text_encoder(name)
    segments = study.prompt_segments(prompt_id)
    texts = {f"{prompt_id}/{i}": segment.text for i, segment in enumerate(segments)}
    contexts = encode_prompts(encoder, texts, device=pick_device(study.device) if encoder.kind != "demo" else None)
    embeddings = []
    for i, key in enumerate(texts):
        suffix = ".prompt.safetensors" if len(segments) == 1 else f".prompt.segment{i}.safetensors"
        embeddings.append(out.with_name(out.name + suffix))
        save_embedding(embeddings[-1], contexts[key], prompt=texts[key], encoder=encoder)
    params = study.extract_params(study.source_name(name, variant), "_".join(map(str, layers)))
    extract_job(
        checkpoint=params["checkpoint"],
        variant=variant,
        prompt_id=prompt_id,
        seed=config["seeds"][0],
        layers=layers,
        output=out,
        embedding=embeddings,
        segment_starts=study.segment_starts(prompt_id),
        weights_sha256=study.weights_sha256(name),
        generation=params["generation"],
        capture=params["capture"],
        compute=params["compute"],
    )
    print(f"wrote {len(layers)} layers' files under {out}")
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    """Every table of a source from its extraction folders (or imported tables), as the
    workflow's aggregation makes them (the same job function)."""
    from sinkscope.pipeline.aggregate import aggregate_job
    from sinkscope.pipeline.jobs import log_to
    from sinkscope.pipeline.study import SOURCE_TABLES

    log_to(None)
    inputs = [Path(path) for path in args.input]
    for entry in inputs:
        if not entry.exists():
            raise ConfigError(f"--input {str(entry)!r} does not exist")
        if not (_is_extraction_folder(entry) or _is_imported_table(entry)):
            raise ConfigError(f"--input {str(entry)!r} is neither an extraction folder nor a table import-cache wrote")
    out = Path(args.out)
    _check_output(out, inputs=inputs, force=args.force, ours=_is_aggregated_folder, what="tables it aggregated")
    out.mkdir(parents=True, exist_ok=True)
    outputs = {
        table: str(out / table) if table == "token_profiles" else str(out / f"{table}.parquet")
        for table in SOURCE_TABLES
    }
    outputs["head_classes"] = str(out / "head_classes.csv")
    params = {
        "name": args.name or _source_name(inputs),
        "sink_frames": _sink_frames(inputs),
        "diagnostics": schema_defaults("diagnostics"),
    }
    aggregate_job(inputs, outputs, params)
    print(f"wrote {len(outputs)} tables of {params['name']} to {args.out}")
    return 0


def _source_name(inputs: list[Path]) -> str:
    """The workflow's source name (checkpoint, or checkpoint@variant) of the first input."""
    from sinkscope.manifests import read_manifest
    from sinkscope.naming import layer_file
    from sinkscope.pipeline.study import Study
    from sinkscope.tables import DEFAULT_VARIANT, read_metadata

    first = inputs[0]
    if first.is_dir():  # the frame table of its first layer
        first = Path(layer_file(first, read_manifest(first)["contents"]["layers"][0]))
    meta = read_metadata(first)
    checkpoint = (
        (meta.get("checkpoint") or {}).get("name")
        if isinstance(meta.get("checkpoint"), dict)
        else meta.get("checkpoint")
    )
    return Study.source_name(str(checkpoint or "cli"), str(meta.get("variant") or DEFAULT_VARIANT))


def _sink_frames(inputs: list[Path]) -> int:
    """The sink frames of the generation that wrote the first extraction folder (0 for imports)."""
    from sinkscope.manifests import read_manifest

    for entry in inputs:
        if entry.is_dir():
            return int(read_manifest(entry)["contents"].get("generation", {}).get("sink_frames", 0))
    return 0


def _is_aggregated_folder(path: Path) -> bool:
    from sinkscope.tables import read_metadata

    try:
        return path.is_dir() and "sources" in read_metadata(path / "frame_attention.parquet")
    except (SinkscopeError, OSError):
        return False


def cmd_import_cache(args: argparse.Namespace) -> int:
    from sinkscope.pipeline.imports import import_job
    from sinkscope.pipeline.jobs import log_to

    log_to(None)
    source, out = Path(args.path), Path(args.out)
    if not source.is_file():
        raise ConfigError(f"attention cache {str(source)!r} does not exist")
    _check_output(out, inputs=[source], force=args.force, ours=_is_imported_table, what="a table it imported")
    entry = {"prompt_id": args.prompt_id, "seed": args.seed, "allow_pickle": args.allow_pickle}
    import_job(source, out, args.checkpoint, entry)
    print(f"wrote {args.out}")
    return 0


def _check_output(out: Path, *, inputs: list[Path], force: bool, ours, what: str) -> None:
    """Refuse an ``--out`` that would replace an input or something this command did not
    write; an earlier output of the same command is replaced only with ``--force``."""
    if any(out.resolve() == path.resolve() for path in inputs):
        raise ConfigError(f"--out {str(out)!r} is an input of this command; choose another path")
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not any(out.iterdir()):
        return
    if not ours(out):
        kind = "folder" if out.is_dir() else "file"
        raise ConfigError(f"--out {str(out)!r} is an existing {kind} this command did not write; choose another path")
    if not force:
        raise ConfigError(f"--out {str(out)!r} holds {what} already; add --force to replace it")


def _is_imported_table(path: Path) -> bool:
    from sinkscope.tables import read_metadata

    try:
        return path.is_file() and "legacy_layout" in read_metadata(path)
    except SinkscopeError:
        return False


def _is_extraction_folder(path: Path) -> bool:
    from sinkscope.manifests import read_manifest

    try:
        return path.is_dir() and "layers" in read_manifest(path)["contents"]
    except SinkscopeError:
        return False


def cmd_compare_labels(args: argparse.Namespace) -> int:
    from sinkscope import plot
    from sinkscope.labels import read_label_file
    from sinkscope.pipeline.jobs import log_to
    from sinkscope.stats.labels import agreement, reference_frame
    from sinkscope.tables import read_table

    log_to(None)
    labels = read_label_file(args.labels)
    table = read_table(args.input)
    if args.checkpoint is not None:
        table = table[table["checkpoint"] == args.checkpoint]
        if table.empty:
            raise SinkscopeError(f"{args.input}: no rows of checkpoint {args.checkpoint!r}")
    if args.variant is not None:
        table = table[table["variant"] == args.variant]
        if table.empty:
            raise SinkscopeError(f"{args.input}: no rows of variant {args.variant!r}")
    try:
        result = agreement(table, labels, args.step)
    except ValueError as error:
        raise SinkscopeError(f"{args.input}: {error}") from None
    print(result.text())
    if args.out:
        fig = plot.plot_label_agreement(table, reference_frame(labels), step=args.step)
        svg, png = plot.save(fig, args.out)
        print(f"wrote {svg} and {png}")
    return 0


def cmd_findings(args: argparse.Namespace) -> int:
    from sinkscope.pipeline.findings import update_docs

    for doc in args.docs:
        if not Path(doc).is_file():
            raise ConfigError(f"{doc!r} is not a file (give the docs whose findings regions to write)")
    if not Path(args.tables).is_dir():
        raise ConfigError(f"--tables {args.tables!r} is not a folder (the study's results/tables)")
    changed = update_docs(args.docs, args.tables, check=args.check)  # FindingsError: one line, status 2
    verb = "would rewrite" if args.check else "rewrote"
    for doc, kinds in changed.items():
        print(f"{doc}: {verb} {', '.join(kinds)}" if kinds else f"{doc}: up to date")
    return 1 if args.check and any(changed.values()) else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from sinkscope.pipeline.integrity import CHECKED_SUFFIXES, check_result

    root = Path(args.results)
    if not root.exists():
        raise ConfigError(f"{str(root)!r} does not exist (give the results folder or one result)")
    checkable = f"folders with a manifest, {', '.join(CHECKED_SUFFIXES)} files"
    results, moved_aside, others = _results_under(root)
    if not results and not moved_aside:
        if root.is_file():
            raise ConfigError(f"{str(root)!r}: sinkscope cannot check a file of this kind (it checks {checkable})")
        raise ConfigError(f"{str(root)!r} holds nothing sinkscope can check (it checks {checkable})")
    problems = [problem for result in results for problem in check_result(result, full=True)]
    for line in problems:
        print(line)
    folders = sum(p.is_dir() for p in results)
    aside = f"; {len(moved_aside)} moved aside as damaged, not checked" if moved_aside else ""
    if others:
        kinds = sorted({path.suffix or path.name for path in others})
        aside += f"; {len(others)} other files not checked ({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''})"
    print(
        f"checked {len(results)} results ({folders} folders, {len(results) - folders} files){aside}: "
        f"{'all whole' if not problems else f'{len(problems)} problems'}",
        file=sys.stderr,
    )
    return 1 if problems else 0


def _results_under(root: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """The results at or below ``root``: folders that hold a manifest (taken whole),
    extraction and dataset folders without one (incomplete), and the files whose kind
    ``check_result`` checks outside them; what was moved aside as damaged; and the
    other files (logs, benchmarks, hidden files), which no check covers."""
    from sinkscope.manifests import DATASET_MANIFEST, MANIFEST
    from sinkscope.pipeline.integrity import is_checked_file, is_moved_aside

    if root.is_file():
        if is_moved_aside(root):
            return [], [root], []
        return ([root], [], []) if is_checked_file(root) else ([], [], [root])
    results, moved_aside, others = [], [], []
    for directory, folders, files in os.walk(root):
        here = Path(directory)
        if is_moved_aside(here):
            moved_aside.append(here)
            folders.clear()
            continue
        if MANIFEST in files or DATASET_MANIFEST in files or _is_result_folder(here.name):
            results.append(here)  # check_result names a missing manifest
            folders.clear()
            continue
        for name in sorted(files):
            path = here / name
            if is_moved_aside(path):
                moved_aside.append(path)
            elif is_checked_file(path) and not name.startswith("."):
                results.append(path)
            else:
                others.append(path)
        for name in list(folders):
            if name.startswith(".") and not is_moved_aside(name):  # a job's temporary folder
                folders.remove(name)
                others.append(here / name)
    return results, moved_aside, others


def _is_result_folder(name: str) -> bool:
    """An extraction folder or a Parquet dataset folder, which a manifest completes."""
    from sinkscope.naming import is_group_folder

    return is_group_folder(name) or name.endswith(".parquet")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="sinkscope", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"sinkscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_check(sub)
    models = sub.add_parser("models", help="list the named model configs")
    models.set_defaults(func=cmd_models)
    _add_extract(sub)
    _add_import_cache(sub)
    _add_aggregate(sub)
    add_figure_parser(sub)
    _add_compare_labels(sub)
    _add_verify(sub)
    _add_findings(sub)
    # Only listed here: main() hands its arguments to sinkscope.demo.train (which imports torch).
    sub.add_parser(
        "train-demo",
        add_help=False,
        help="train the demo model on synthetic videos (options: sinkscope train-demo --help; docs/trained-demo.md)",
    )
    return parser


def _add_check(sub: argparse._SubParsersAction) -> None:
    """``sinkscope check``: a config checked as the Snakefile does."""
    check = sub.add_parser(
        "check",
        help="validate a config as the Snakefile does: every problem, one line each, or a verdict line "
        "(runs, jobs, layers, device, an estimate of the time)",
    )
    check.add_argument(
        "config",
        nargs="?",
        default="config.yaml",
        help="the study: config.yaml, or the file snakemake gets with --configfile (which replaces config.yaml)",
    )
    check.add_argument(
        "overrides",
        nargs="*",
        help="key=value as snakemake --config takes them: YAML values, nested keys as "
        "'generation={num_frames: 9}' (no dotted keys)",
    )
    check.add_argument(
        "--cluster", action="store_true", help="jobs run elsewhere: skip checks of this machine's devices"
    )
    check.add_argument(
        "--show-config",
        action="store_true",
        help="print the config as every rule reads it (defaults filled in, the variants the study adds listed)",
    )
    check.add_argument(
        "--results",
        action="store_true",
        help="instead of printing the config, check the finished extraction folders: list (one line "
        "each) the calls whose cache contents contradict the layout their cache policy declares",
    )
    check.set_defaults(func=cmd_check)


def _add_extract(sub: argparse._SubParsersAction) -> None:
    """``sinkscope extract``: one extraction job outside Snakemake."""
    extract = sub.add_parser("extract", help="run one extraction job outside Snakemake")
    extract.add_argument("--config", default="config.yaml")
    extract.add_argument("--checkpoint", help="checkpoint name (default: the first)")
    extract.add_argument("--variant", help="generation variant (default: the first)")
    extract.add_argument("--prompt", help="prompt id (default: the first)")
    extract.add_argument("--seed", type=natural, help="noise seed (default: the config's first)")
    extract.add_argument("--layers", type=natural, nargs="+", help="0-based layers (default: the config's)")
    extract.add_argument(
        "--out",
        required=True,
        type=output_path,
        help=f"folder for the layer<N>*.parquet files and manifest.json; {OUTPUT_RULE}",
    )
    extract.add_argument(
        "--force", action="store_true", help="replace an extraction folder an earlier extract wrote at --out"
    )
    extract.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override (YAML value; dotted keys, e.g. generation.local_attn_frames=9), repeatable",
    )
    extract.set_defaults(func=cmd_extract)


def _add_import_cache(sub: argparse._SubParsersAction) -> None:
    """``sinkscope import-cache``: an older script's ``.pt`` cache as rows."""
    imp = sub.add_parser("import-cache", help="convert an older extraction script's .pt cache to frame_attention rows")
    imp.add_argument("path")
    imp.add_argument("--out", required=True, type=output_path, help=f"output .parquet; {OUTPUT_RULE}")
    imp.add_argument(
        "--checkpoint", default="legacy", type=arguments.name, help="name for the checkpoint column (default: legacy)"
    )
    imp.add_argument("--prompt-id", default=None, type=arguments.name, help="prompt id for the rows (default: legacy)")
    imp.add_argument("--seed", type=natural, default=0, help="seed for the rows (older caches did not record one)")
    imp.add_argument(
        "--allow-pickle", action="store_true", help="allow unpickling objects beyond tensors (trusted files only)"
    )
    imp.add_argument("--force", action="store_true", help="replace a table an earlier import-cache wrote at --out")
    imp.set_defaults(func=cmd_import_cache)


def _add_aggregate(sub: argparse._SubParsersAction) -> None:
    """``sinkscope aggregate``: a source's tables from its extraction folders."""
    agg = sub.add_parser(
        "aggregate",
        help="build every table of a source (block_stats, head_diagnostics...) from "
        "its extraction folders, as the workflow does",
    )
    agg.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="extraction folders (sinkscope extract --out, or results/extract/...) or imported tables",
    )
    agg.add_argument(
        "--out",
        required=True,
        type=output_path,
        help=f"folder for <table>.parquet, head_classes.csv and token_profiles/; {OUTPUT_RULE}",
    )
    agg.add_argument(
        "--name",
        type=arguments.source_name,
        help="the source name in the tables (default: checkpoint[@variant] of the inputs)",
    )
    agg.add_argument("--force", action="store_true", help="replace tables an earlier aggregate wrote at --out")
    agg.set_defaults(func=cmd_aggregate)


def _add_compare_labels(sub: argparse._SubParsersAction) -> None:
    """``sinkscope compare-labels``: a published label file against the study's head classes."""
    compare = sub.add_parser(
        "compare-labels",
        help="a published per-head label file (e.g. Pyramid Forcing's) against "
        "the study's head_class and pyramid_label: confusion counts, agreement",
    )
    compare.add_argument("--labels", required=True, help="CSV, one row per layer, one column per head, cells -1/1/2")
    compare.add_argument("--input", required=True, help="head_diagnostics.parquet (results/tables/ or a source's)")
    compare.add_argument("--checkpoint", help="the checkpoint compared, when the table holds several")
    compare.add_argument("--variant", help="the variant compared, when the table holds several")
    compare.add_argument(
        "--step", type=call_step, default="last", help="the call compared: last, cache or a step index"
    )
    compare.add_argument(
        "--out",
        metavar="PREFIX",
        type=output_path,
        help=f"also draw the confusion figure to PREFIX.svg and PREFIX.png; {OUTPUT_RULE}",
    )
    compare.set_defaults(func=cmd_compare_labels)


def _add_verify(sub: argparse._SubParsersAction) -> None:
    """``sinkscope verify``: every result checked in full."""
    verifies = (
        "check every result in full (manifests, checksums, content digests, figures, CSV tables, prompt "
        "embeddings); results moved aside as damaged and files that are not results (logs) are counted, not "
        "checked; a file or folder with nothing it can check is refused"
    )
    verify = sub.add_parser("verify", help=verifies, description=verifies[0].upper() + verifies[1:] + ".")
    verify.add_argument(
        "results", nargs="?", default="results", help="the results folder, or one result (file or folder)"
    )
    verify.set_defaults(func=cmd_verify)


def _add_findings(sub: argparse._SubParsersAction) -> None:
    """``sinkscope findings``: the docs' findings regions written from a study's tables."""
    findings = sub.add_parser(
        "findings",
        help="write the numbers of the docs' findings regions (<!-- begin: findings KIND --> ... <!-- end -->) "
        "from a finished study's tables",
    )
    findings.add_argument("docs", nargs="+", help="the docs (markdown) whose findings regions to write")
    findings.add_argument(
        "--tables", default="results/tables", help="the study's tables folder (default results/tables)"
    )
    findings.add_argument(
        "--check", action="store_true", help="write nothing; exit status 1 when a region's numbers differ"
    )
    findings.set_defaults(func=cmd_findings)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train-demo"]:
        from sinkscope.demo.train import main as train_main

        return train_main(argv[1:], prog="sinkscope train-demo")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SinkscopeError, FileNotFoundError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"sinkscope {args.command}: error: {message}", file=sys.stderr)
        return 2
