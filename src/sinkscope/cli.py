"""The ``sinkscope`` command: the pipeline's jobs, runnable without Snakemake.

    sinkscope check [config.yaml] [key=value ...]   validate a config, print it normalized
    sinkscope models                                 named model configs and their sizes
    sinkscope extract --layers 0 4 --out DIR         one extraction job (one generation)
    sinkscope import-cache PATH --out OUT.parquet    convert an older .pt attention cache
    sinkscope figure KIND --input FILE ... --out-prefix PATH   draw one figure

Errors print one line naming the file, key or value, and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from . import __version__
from .config import ConfigError, checkpoint_specs, load_config


def _overrides(pairs: list[str]) -> dict:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"override {pair!r} is not key=value")
        result[key] = yaml.safe_load(value)
    return result


def cmd_check(args: argparse.Namespace) -> int:
    config = load_config(args.config, _overrides(args.overrides))
    print(yaml.safe_dump(config, sort_keys=False), end="")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .model import MODEL_CONFIGS

    for name, config in MODEL_CONFIGS.items():
        print(f"{name}: {config.num_layers} layers x {config.num_heads} heads, dim {config.dim}, "
              f"{config.frame_seq_length()} tokens a frame ({config.latent_height}x{config.latent_width} latents)")  # fmt: skip
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from .jobs import extract_job, log_to, pick_device
    from .model.loading import weights_digest
    from .text import encode_prompts, save_embedding
    from .workflow import Study

    log_to(None)
    config = load_config(args.config, _overrides(args.overrides))
    study = Study(config)
    name = args.checkpoint or next(iter(config["checkpoints"]))
    if name not in config["checkpoints"]:
        raise ConfigError(f"checkpoint {name!r} is not in the config (known: {', '.join(config['checkpoints'])})")
    prompt_id = args.prompt or next(iter(config["prompts"]))
    if prompt_id not in config["prompts"]:
        raise ConfigError(f"prompt {prompt_id!r} is not in the config (known: {', '.join(config['prompts'])})")
    layers = args.layers or study.layers
    out = Path(args.out)
    encoder = study.text_encoder(name)
    embedding = out / "prompt.safetensors"
    context = encode_prompts(encoder, {prompt_id: config["prompts"][prompt_id]}, device=pick_device(config["device"]))
    save_embedding(embedding, context[prompt_id], prompt=config["prompts"][prompt_id], encoder=encoder)
    extract_job(
        checkpoint=checkpoint_specs(config)[name].to_dict(),
        prompt_id=prompt_id,
        seed=args.seed if args.seed is not None else config["seeds"][0],
        layers=layers,
        outputs=[Study.layer_file(str(out), layer) for layer in layers],
        embedding=embedding,
        weights_sha256=weights_digest(checkpoint_specs(config)[name]),
        generation=config["generation"],
        backend=config["capture"]["backend"],
        compile=config["capture"]["compile"],
        device=config["device"],
    )
    print(f"wrote {len(layers)} layer files under {out}")
    return 0


def cmd_import_cache(args: argparse.Namespace) -> int:
    from .jobs import import_job, log_to

    log_to(None)
    entry = {"prompt_id": args.prompt_id, "seed": args.seed, "allow_pickle": args.allow_pickle}
    import_job(args.path, args.out, args.checkpoint, entry)
    print(f"wrote {args.out}")
    return 0


def cmd_figure(args: argparse.Namespace) -> int:
    from .jobs import figure_job, frame_files, log_to
    from .workflow import LAYER_FIGURES

    log_to(None)
    if args.kind in LAYER_FIGURES and args.layer is None:
        raise ConfigError(f"figure {args.kind!r} needs --layer")
    options = {"step": args.step if args.step in ("last", "cache") else int(args.step), "metric": args.metric,
               "heads": args.heads, "video_frames": args.video_frames, "dpi": args.dpi}  # fmt: skip
    figure_job(
        kind=args.kind,
        inputs=frame_files(args.input, args.layer),
        source=args.source or args.checkpoint or "sinkscope",
        layer=args.layer,
        options=options,
        svg=f"{args.out_prefix}.svg",
        png=f"{args.out_prefix}.png",
        checkpoint=args.checkpoint,
    )
    print(f"wrote {args.out_prefix}.svg and .png")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .workflow import LAYER_FIGURES, SOURCE_FIGURES

    parser = argparse.ArgumentParser(prog="sinkscope", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sinkscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="validate a config and print it with defaults filled in")
    check.add_argument("config", nargs="?", default="config.yaml")
    check.add_argument("overrides", nargs="*", help="key=value (YAML values), as snakemake --config")
    check.set_defaults(func=cmd_check)

    models = sub.add_parser("models", help="list the named model configs")
    models.set_defaults(func=cmd_models)

    extract = sub.add_parser("extract", help="run one extraction job outside Snakemake")
    extract.add_argument("--config", default="config.yaml")
    extract.add_argument("--checkpoint", help="checkpoint name (default: the first)")
    extract.add_argument("--prompt", help="prompt id (default: the first)")
    extract.add_argument("--seed", type=int)
    extract.add_argument("--layers", type=int, nargs="+", help="0-based layers (default: the config's)")
    extract.add_argument("--out", required=True, help="folder for layer<N>.parquet files")
    extract.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="config override (YAML value), repeatable")
    extract.set_defaults(func=cmd_extract)

    imp = sub.add_parser("import-cache", help="convert an older extraction script's .pt cache to frame_attention rows")
    imp.add_argument("path")
    imp.add_argument("--out", required=True, help="output .parquet")
    imp.add_argument("--checkpoint", default="legacy", help="name for the checkpoint column (default: legacy)")
    imp.add_argument("--prompt-id", default=None, help="prompt id for the rows (default: legacy)")
    imp.add_argument("--seed", type=int, default=0)
    imp.add_argument("--allow-pickle", action="store_true", help="allow unpickling objects beyond tensors (trusted files only)")
    imp.set_defaults(func=cmd_import_cache)

    fig = sub.add_parser("figure", help="draw one figure from frame_attention Parquet files")
    fig.add_argument("kind", choices=SOURCE_FIGURES + LAYER_FIGURES)
    fig.add_argument("--input", nargs="+", required=True, help="frame_attention .parquet files or extraction folders")
    fig.add_argument("--out-prefix", required=True, help="writes PREFIX.svg and PREFIX.png")
    fig.add_argument("--checkpoint", help="the checkpoint to draw, when the input holds several")
    fig.add_argument("--source", help="name shown in titles (default: the checkpoint)")
    fig.add_argument("--layer", type=int)
    fig.add_argument("--step", default="last")
    fig.add_argument("--metric", default="logit_mean", choices=["logit_mean", "prob_mass"])
    fig.add_argument("--heads", nargs="+", default=["L1H1", "L5H10"])
    fig.add_argument("--video-frames", action="store_true")
    fig.add_argument("--dpi", type=int, default=200)
    fig.set_defaults(func=cmd_figure)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError, KeyError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"sinkscope {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

