"""The ``sinkscope`` command: the pipeline's jobs and checks, runnable without Snakemake.

    sinkscope check [config.yaml] [key=value ...]   validate a config as the Snakefile does, print it normalized
    sinkscope models                                 named model configs and their sizes
    sinkscope extract --layers 0 4 --out DIR         one extraction job (one generation)
    sinkscope import-cache PATH --out OUT.parquet    convert an older .pt attention cache
    sinkscope figure KIND --input FILE ... --out-prefix PATH   draw one figure
    sinkscope verify results/                        check every result file's integrity
    sinkscope train-demo --out DIR                   train the demo model on synthetic videos

Errors print one line naming the file, key or value, and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from sinkscope import __version__
from sinkscope.errors import ConfigError, OneLineArgumentParser, SinkscopeError


def _natural(text: str) -> int:
    """argparse type: a whole number >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _overrides(pairs: list[str]) -> dict:
    """key=value pairs (YAML values); dotted keys set one nested key (generation.num_frames=9)."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {pair!r} is not key=value")
        try:
            result[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"override {pair!r}: the value is not valid YAML") from None
    return result


def _study(args: argparse.Namespace, *, local: bool = True):
    """The config file plus overrides, through the Snakefile's own check (load_study)."""
    from sinkscope.pipeline.config import apply_overrides, read_config_file
    from sinkscope.pipeline.study import load_study

    return load_study(apply_overrides(read_config_file(args.config), _overrides(args.overrides)), local=local)


def cmd_check(args: argparse.Namespace) -> int:
    study = _study(args, local=not args.cluster)
    print(yaml.safe_dump(dict(study.config), sort_keys=False), end="")
    print(f"# extraction jobs compute on: {study.device}", file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from sinkscope.model import MODEL_CONFIGS
    from sinkscope.pipeline.resources import parameter_count

    for name, config in MODEL_CONFIGS.items():
        print(f"{name}: {config.num_layers} layers x {config.num_heads} heads, dim {config.dim}, "
              f"{parameter_count(config) / 1e6:.1f}M parameters, {config.frame_seq_length()} tokens a frame "
              f"({config.latent_height}x{config.latent_width} latents)")  # fmt: skip
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from sinkscope.model.text import encode_prompts, save_embedding
    from sinkscope.pipeline.extract import extract_job
    from sinkscope.pipeline.jobs import log_to, pick_device

    log_to(None)
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
    if variant not in study.variants:
        raise ConfigError(f"variant {variant!r} is not in the config (known: {', '.join(study.variants)})")
    prompt_id = args.prompt or next(iter(config["prompts"]))
    if prompt_id not in config["prompts"]:
        raise ConfigError(f"prompt {prompt_id!r} is not in the config (known: {', '.join(config['prompts'])})")
    layers = study.layers
    out = Path(args.out)
    encoder = study.text_encoder(name)
    embedding = out.with_name(out.name + ".prompt.safetensors")
    context = encode_prompts(encoder, {prompt_id: config["prompts"][prompt_id]},
                             device=pick_device(study.device) if encoder.kind != "demo" else None)  # fmt: skip
    save_embedding(embedding, context[prompt_id], prompt=config["prompts"][prompt_id], encoder=encoder)
    params = study.extract_params(study.source_name(name, variant), "_".join(map(str, layers)))
    extract_job(
        checkpoint=params["checkpoint"],
        variant=variant,
        prompt_id=prompt_id,
        seed=config["seeds"][0],
        layers=layers,
        output=out,
        embedding=embedding,
        weights_sha256=study.weights_sha256(name),
        generation=params["generation"],
        capture=params["capture"],
        compute=params["compute"],
    )
    print(f"wrote {len(layers)} layers' files under {out}")
    return 0


def cmd_import_cache(args: argparse.Namespace) -> int:
    from sinkscope.pipeline.imports import import_job
    from sinkscope.pipeline.jobs import log_to

    log_to(None)
    entry = {"prompt_id": args.prompt_id, "seed": args.seed, "allow_pickle": args.allow_pickle}
    import_job(args.path, args.out, args.checkpoint, entry)
    print(f"wrote {args.out}")
    return 0


def cmd_figure(args: argparse.Namespace) -> int:
    from sinkscope.figures.registry import LAYER_FIGURES
    from sinkscope.figures.render import draw, save_figure
    from sinkscope.pipeline.jobs import log_to
    from sinkscope.tables import read_table

    log_to(None)
    if args.kind in LAYER_FIGURES and args.layer is None:
        raise ConfigError(f"figure {args.kind!r} needs --layer")
    options = {"step": args.step if args.step in ("last", "cache") else int(args.step), "metric": args.metric,
               "heads": args.heads, "video_frames": args.video_frames, "dpi": args.dpi, "frame_base": args.frame_base,
               "highlight_layers": args.highlight_layers}  # fmt: skip
    tables = {}
    for path in args.input:
        name = Path(path).name.removesuffix(".parquet")
        name = name if name in ("frame_attention", "head_diagnostics", "block_stats", "token_profiles") else "frame_attention"
        table = read_table(path)
        tables[name] = table if name not in tables else __import__("pandas").concat([tables[name], table], ignore_index=True)
    for name, table in tables.items():
        for column, wanted in (("checkpoint", args.checkpoint), ("variant", args.variant)):
            if column not in table:
                continue
            present = sorted(set(table[column]))
            if wanted is not None:
                if wanted not in present:
                    raise ConfigError(f"{column} {wanted!r} is not in the input (it has {', '.join(present)})")
                table = table[table[column] == wanted]
            elif len(present) > 1 and args.kind not in ("policy_comparison", "sink_mass_over_time"):
                raise ConfigError(f"the input holds several {column}s ({', '.join(present)}); choose one (--{column})")
        tables[name] = table
    figure = draw(args.kind, tables, source=args.source or args.checkpoint or "sinkscope", layer=args.layer, options=options)
    save_figure(figure, f"{args.out_prefix}.svg", f"{args.out_prefix}.png", dpi=args.dpi)
    print(f"wrote {args.out_prefix}.svg and .png")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from sinkscope.pipeline.integrity import check_result, is_moved_aside

    root = Path(args.results)
    if not root.exists():
        raise ConfigError(f"{str(root)!r} does not exist (give the results folder or one result)")
    results, moved_aside = _results_under(root, is_moved_aside)
    problems = [problem for result in results for problem in check_result(result, full=True)]
    for line in problems:
        print(line)
    folders = sum(p.is_dir() for p in results)
    aside = f"; {len(moved_aside)} moved aside as damaged, not checked" if moved_aside else ""
    print(f"checked {len(results)} results ({folders} folders, {len(results) - folders} files){aside}: "
          f"{'all whole' if not problems else f'{len(problems)} problems'}", file=sys.stderr)  # fmt: skip
    return 1 if problems else 0


def _results_under(root: Path, is_moved_aside) -> tuple[list[Path], list[Path]]:
    """The results at or below ``root``: folders that hold a manifest (taken whole), and
    Parquet files, figures and pages outside them; and what was moved aside as damaged."""
    from sinkscope.manifests import DATASET_MANIFEST, MANIFEST

    if root.is_file():
        return ([], [root]) if is_moved_aside(root) else ([root], [])
    results, moved_aside = [], []
    for directory, folders, files in os.walk(root):
        here = Path(directory)
        if is_moved_aside(here):
            moved_aside.append(here)
            folders.clear()
            continue
        if MANIFEST in files or DATASET_MANIFEST in files:
            results.append(here)
            folders.clear()
            continue
        for name in sorted(files):
            path = here / name
            if is_moved_aside(path):
                moved_aside.append(path)
            elif path.suffix in (".parquet", ".png", ".svg", ".html") and not name.startswith("."):
                results.append(path)
    return results, moved_aside


def build_parser() -> argparse.ArgumentParser:
    from sinkscope.figures.registry import CHECKPOINT_FIGURES, LAYER_FIGURES, SOURCE_FIGURES

    parser = OneLineArgumentParser(prog="sinkscope", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sinkscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="validate a config (as the Snakefile does) and print it with defaults filled in")
    check.add_argument("config", nargs="?", default="config.yaml")
    check.add_argument("overrides", nargs="*", help="key=value (YAML values; dotted keys for nested ones), as snakemake --config")
    check.add_argument("--cluster", action="store_true", help="jobs run elsewhere: skip checks of this machine's devices")
    check.set_defaults(func=cmd_check)

    models = sub.add_parser("models", help="list the named model configs")
    models.set_defaults(func=cmd_models)

    extract = sub.add_parser("extract", help="run one extraction job outside Snakemake")
    extract.add_argument("--config", default="config.yaml")
    extract.add_argument("--checkpoint", help="checkpoint name (default: the first)")
    extract.add_argument("--variant", help="generation variant (default: the first)")
    extract.add_argument("--prompt", help="prompt id (default: the first)")
    extract.add_argument("--seed", type=_natural, help="noise seed (default: the config's first)")
    extract.add_argument("--layers", type=_natural, nargs="+", help="0-based layers (default: the config's)")
    extract.add_argument("--out", required=True, help="folder for the layer<N>*.parquet files and manifest.json")
    extract.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="config override (YAML value; dotted keys, e.g. generation.local_attn_frames=9), repeatable")
    extract.set_defaults(func=cmd_extract)

    imp = sub.add_parser("import-cache", help="convert an older extraction script's .pt cache to frame_attention rows")
    imp.add_argument("path")
    imp.add_argument("--out", required=True, help="output .parquet")
    imp.add_argument("--checkpoint", default="legacy", help="name for the checkpoint column (default: legacy)")
    imp.add_argument("--prompt-id", default=None, help="prompt id for the rows (default: legacy)")
    imp.add_argument("--seed", type=int, default=0)
    imp.add_argument("--allow-pickle", action="store_true", help="allow unpickling objects beyond tensors (trusted files only)")
    imp.set_defaults(func=cmd_import_cache)

    fig = sub.add_parser("figure", help="draw one figure from sinkscope tables")
    fig.add_argument("kind", choices=SOURCE_FIGURES + LAYER_FIGURES + CHECKPOINT_FIGURES)
    fig.add_argument("--input", nargs="+", required=True, help="tables (.parquet) or extraction folders the figure reads")
    fig.add_argument("--out-prefix", required=True, help="writes PREFIX.svg and PREFIX.png")
    fig.add_argument("--checkpoint", help="the checkpoint to draw, when the input holds several")
    fig.add_argument("--variant", help="the variant to draw, when the input holds several")
    fig.add_argument("--highlight-layers", type=int, nargs="+", help="layers drawn as curves in layer_comparison")
    fig.add_argument("--source", help="name shown in titles (default: the checkpoint)")
    fig.add_argument("--layer", type=int)
    fig.add_argument("--step", default="last")
    fig.add_argument("--metric", default="logit_mean", choices=["logit_mean", "prob_mass"])
    fig.add_argument("--heads", nargs="+", default=["L1H1", "L5H10"])
    fig.add_argument("--video-frames", action="store_true")
    fig.add_argument("--frame-base", type=int, choices=[0, 1], default=0)
    fig.add_argument("--dpi", type=int, default=200)
    fig.set_defaults(func=cmd_figure)

    verify = sub.add_parser("verify", help="check every result in full (manifests, checksums, content digests, figures); "
                                           "results moved aside as damaged are counted, not checked")  # fmt: skip
    verify.add_argument("results", nargs="?", default="results", help="the results folder, or one result (file or folder)")
    verify.set_defaults(func=cmd_verify)

    # Only listed here: main() hands its arguments to sinkscope.train (which imports torch).
    sub.add_parser("train-demo", add_help=False,
                   help="train the demo model on synthetic videos (options: sinkscope train-demo --help; docs/trained-demo.md)")  # fmt: skip
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
