"""Fingerprints of every generation procedure under every cache policy it runs, for refactors.

On the CPU, with tiny random models (the kinds the tests build: a Wan2.1-like model of 2
layers x 4 heads of 16, and a Wan2.2-TI2V-5B-like one of 48 latent channels), this runs
every registered procedure under every cache policy it accepts, plus prompt switches
(with and without ``re_cache``), the edits of ``generation.interventions`` (``mask_keys``,
``logit_bias``, ``quantize_cache``, ``replace_frames`` from a frame and from noise),
Causal Forcing's first-block steps and independent first frame, LongLive 2.0's scene
cuts, relative RoPE and NVFP4 cache, and Krea's recompute with the latent context and
with a stand-in VAE's re-encode; each with the attention capture on every layer (token
profiles of every call). For each case it records the sha256 of:

- ``latents``: the final latents' bytes (dtype and shape included);
- ``rows``: every captured table (frames, queries, tokens) of every layer, column by column;
- ``calls``: the calls the generation announced, in order;
- ``options``: ``GenerationOptions.to_dict()`` as JSON, in its key order (the rule params).

A refactor of the generation code must leave every hash as it was: run this before the
change and after, and compare::

    PYTHONPATH=src python benchmarks/generation_hashes.py --out before.json
    PYTHONPATH=src python benchmarks/generation_hashes.py --compare before.json

``--graphs`` runs every case with its layers replayed the way CUDA graphs replay them
(``sinkscope.model.layer_graphs.RerunPieces``): the hashes must not change.
``--compare`` exits 1 and names the cases whose hashes differ (or are new or missing).
``--cases NAME ...`` runs a few cases only (``--list`` names them). The JSON of the tree
this was written on is docs/benchmarks/generation-hashes-cpu-2026-11-28.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sinkscope.generation.capture import FrameStatsCapture
from sinkscope.generation.sampler import generate
from sinkscope.model import WanConfig, build_model
from sinkscope.model.layer_graphs import LayerGraphs, RerunPieces
from sinkscope.options import GenerationOptions

# Wan2.1's kind, tiny: head_dim 16 (the nvfp4 formats' blocks), 6 tokens a frame.
SMALL = WanConfig(
    dim=64, ffn_dim=64, num_heads=4, num_layers=2, text_dim=16, text_len=8, freq_dim=16, latent_height=4, latent_width=6
)
# Wan2.2-TI2V-5B's kind (LongLive 2.0), tiny: 48 latent channels, 2 heads of 32.
TINY5B = WanConfig(
    dim=64,
    ffn_dim=96,
    num_heads=2,
    num_layers=2,
    in_dim=48,
    out_dim=48,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=4,
    latent_width=6,
)
MODELS = {"small": SMALL, "5b": TINY5B}
SCENE_CUT = "The scene transitions. "
TWO_STEPS = [1000, 500]
UNIPC_2 = [999, 833]


@dataclass(frozen=True)
class Case:
    """One generation: the model kind and dtype, the ``generation:`` mapping, the prompt
    segments ((start frame, text) a segment), whether a stand-in VAE re-encodes."""

    generation: dict
    model: str = "small"
    dtype: str = "float64"
    segments: tuple[tuple[int, str], ...] = ((0, "a fox"),)
    vae: bool = False
    seed: int = 0
    extra: dict = field(default_factory=dict)


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    windows = {
        "global": {},
        "window": {"local_attn_frames": 6},
        "sink": {"local_attn_frames": 9, "sink_frames": 3},
        "deep_sink": {"local_attn_frames": 9, "sink_frames": 3},
        "participative_compression": {
            "local_attn_frames": 8,
            "sink_frames": 2,
            "budget_frames": 6,
            "recent_frames": 3,
        },
        "rerope_sink": {"local_attn_frames": 9, "sink_frames": 3},
        "rolling_sink": {"local_attn_frames": 9, "sink_frames": 3},
        "relative_rope": {"local_attn_frames": 6, "sink_frames": 1},
        "ema_sink": {"local_attn_frames": 9, "sink_frames": 3},
    }
    for policy, keys in windows.items():
        cases[f"self_forcing/{policy}"] = Case(
            {"num_frames": 18, "denoising_steps": TWO_STEPS, "cache_policy": policy, **keys}
        )
    cases["self_forcing/window/4-steps"] = Case({"num_frames": 12, "local_attn_frames": 6})
    cases["self_forcing/window/float32"] = Case(
        {"num_frames": 12, "denoising_steps": TWO_STEPS, "local_attn_frames": 6}, dtype="float32"
    )
    cases["self_forcing/sink/bfloat16"] = Case(
        {"num_frames": 12, "denoising_steps": TWO_STEPS, "cache_policy": "sink", "local_attn_frames": 9},
        dtype="bfloat16",
    )
    cases["self_forcing/inferred-sink"] = Case(
        {"num_frames": 12, "denoising_steps": TWO_STEPS, "local_attn_frames": 9, "sink_frames": 3}
    )
    # Causal Forcing: the first block's steps, and an independent first frame.
    cases["causal_forcing/first-block-steps"] = Case(
        {"num_frames": 12, "denoising_steps": [1000], "first_block_denoising_steps": [1000, 750, 500, 250]}
    )
    cases["causal_forcing/independent-first-frame"] = Case(
        {
            "num_frames": 10,
            "independent_first_frame": True,
            "denoising_steps": [1000, 500],
            "first_block_denoising_steps": [1000, 750, 500],
            "local_attn_frames": 7,
        }
    )
    # Prompt switches, with LongLive's re-cache and without.
    switch = ((0, "a fox"), (6, "a boat"), (12, "a city"))
    for policy, keys in (("global", {}), ("window", {"local_attn_frames": 6}), ("sink", {"local_attn_frames": 9})):
        for recache in (True, False):
            cases[f"switch/{policy}/re_cache={recache}"] = Case(
                {"num_frames": 15, "denoising_steps": TWO_STEPS, "cache_policy": policy, "re_cache": recache, **keys},
                segments=switch,
            )
    cases["switch/deep_sink/no-re_cache"] = Case(
        {
            "num_frames": 15,
            "denoising_steps": TWO_STEPS,
            "cache_policy": "deep_sink",
            "local_attn_frames": 9,
            "sink_frames": 3,
            "re_cache": False,
        },
        segments=switch,
    )
    # Edits during generation.
    edits = {
        "mask_keys": [{"edit": "mask_keys", "heads": ["L1H1", "L2H3"], "key_frames": [0, 1]}],
        "mask_sink": [{"edit": "mask_keys", "heads": "all", "key_frames": "sink"}],
        "logit_bias": [{"edit": "logit_bias", "heads": ["L1H2", "L2H4"], "key_frames": "cached", "bias": -2.5}],
        "quantize_int8": [{"edit": "quantize_cache", "format": "int8"}],
        "quantize_nvfp4": [{"edit": "quantize_cache", "format": "nvfp4", "tensors": "k"}],
        "replace_frame": [{"edit": "replace_frames", "key_frames": [4, 5], "source": 1}],
        "replace_noise": [{"edit": "replace_frames", "key_frames": [2], "source": "noise"}],
        "mixed": [
            {"edit": "quantize_cache", "format": "fp8_e4m3"},
            {"edit": "logit_bias", "heads": ["L2H1"], "key_frames": [0], "bias": 1.5},
        ],
    }
    for name, interventions in edits.items():
        for policy, keys in (("window", {"local_attn_frames": 9}), ("sink", {"local_attn_frames": 9})):
            cases[f"edits/{policy}/{name}"] = Case(
                {
                    "num_frames": 15,
                    "denoising_steps": TWO_STEPS,
                    "cache_policy": policy,
                    "interventions": interventions,
                    **keys,
                }
            )
    cases["edits/global/replace_frame+switch"] = Case(
        {"num_frames": 15, "denoising_steps": TWO_STEPS, "interventions": edits["replace_frame"]}, segments=switch
    )
    cases["edits/deep_sink/mask_keys"] = Case(
        {
            "num_frames": 15,
            "denoising_steps": TWO_STEPS,
            "cache_policy": "deep_sink",
            "interventions": edits["mask_sink"],
        }
    )
    cases["edits/relative_rope/replace_frame"] = Case(
        {
            "num_frames": 15,
            "denoising_steps": TWO_STEPS,
            "cache_policy": "relative_rope",
            "local_attn_frames": 9,
            "sink_frames": 3,
            "interventions": edits["replace_frame"],
        }
    )
    cases["edits/participative_compression/quantize_int8"] = Case(
        {
            "num_frames": 15,
            "denoising_steps": TWO_STEPS,
            "cache_policy": "participative_compression",
            "local_attn_frames": 8,
            "sink_frames": 2,
            "budget_frames": 6,
            "recent_frames": 3,
            "interventions": edits["quantize_int8"],
        }
    )
    # Rolling Forcing's window.
    cases["rolling_forcing"] = Case(
        {"procedure": "rolling_forcing", "num_frames": 18, "denoising_steps": [1000, 750, 500], "local_attn_frames": 12}
    )
    cases["rolling_forcing/5-levels"] = Case(
        {"procedure": "rolling_forcing", "num_frames": 24, "denoising_steps": [1000, 800, 600, 400, 200]}
    )
    # Krea Realtime: the recomputed cache, the latent context and the stand-in VAE's re-encode.
    krea = {"procedure": "krea_recompute", "num_frames": 15, "denoising_steps": [1000, 908, 713, 0]}
    cases["krea_recompute/latent"] = Case({**krea, "recompute_context": "latent"})
    cases["krea_recompute/reencode"] = Case(krea, vae=True)
    cases["krea_recompute/latent/mask_keys"] = Case(
        {**krea, "recompute_context": "latent", "interventions": edits["mask_keys"]}
    )
    cases["krea_recompute/reencode/quantize_int8"] = Case({**krea, "interventions": edits["quantize_int8"]}, vae=True)
    # LongLive 2.0: chunks, UniPC steps, the clean pass, scene cuts; relative RoPE; NVFP4.
    shots = (
        (0, "a fox"),
        (10, SCENE_CUT + "a boat"),
        (12, "a boat"),
        (16, SCENE_CUT + "a city"),
        (18, "a city"),
    )
    ll2 = {
        "procedure": "longlive2",
        "num_frames": 20,
        "frames_per_block": 2,
        "local_attn_frames": 8,
        "sink_frames": 2,
        "denoising_steps": UNIPC_2,
        "re_cache": False,
    }
    for name, extra in (
        ("plain", {}),
        ("relative", {"use_relative_rope": True}),
        ("kv_quant", {"kv_quant": True}),
        ("relative+kv_quant", {"use_relative_rope": True, "kv_quant": True}),
    ):
        cases[f"longlive2/shots/{name}"] = Case({**ll2, **extra}, model="5b", segments=shots)
    cases["longlive2/one-prompt/4-steps"] = Case(
        {**ll2, "num_frames": 12, "denoising_steps": [999, 937, 833, 624]}, model="5b"
    )
    cases["longlive2/chunks4"] = Case(
        {**ll2, "num_frames": 24, "frames_per_block": 4, "local_attn_frames": 12},
        model="5b",
        segments=((0, "a fox"), (8, SCENE_CUT + "a boat"), (12, "a boat"), (16, SCENE_CUT + "a city")),
    )
    cases["longlive2/mask_keys"] = Case(
        {
            **ll2,
            "num_frames": 8,
            "local_attn_frames": 6,
            "interventions": [{"edit": "mask_keys", "heads": ["L1H1", "L2H2"], "key_frames": [0]}],
        },
        model="5b",
    )
    return cases


CASES = _cases()


class StandInVAE:
    """A causal stand-in for Wan's VAE (as tests/test_krea.py's): video frame 0 from latent 0,
    frames 4f-3..4f from latents f and f - 1; encode maps one frame back to one latent."""

    def __init__(self, channels: int, dtype: torch.dtype) -> None:
        g = torch.Generator().manual_seed(9)
        self.up = torch.randn(3, channels, generator=g, dtype=torch.float64).to(dtype)
        self.down = torch.randn(channels, 3, generator=g, dtype=torch.float64).to(dtype)

    def _pixels(self, z: torch.Tensor) -> torch.Tensor:
        return torch.einsum("oc,bchw->bohw", self.up, z).repeat_interleave(8, -2).repeat_interleave(8, -1)

    def decode_pixels(self, latents: torch.Tensor) -> torch.Tensor:
        frames = [self._pixels(latents[:, :, 0])]
        for f in range(1, latents.shape[2]):
            for j in range(4):
                frames.append(self._pixels(latents[:, :, f]) * (j + 1) / 4 + self._pixels(latents[:, :, f - 1]) * 0.1)
        return torch.stack(frames, dim=2)

    def pixel_stream(self):
        vae = self

        class Stream:
            seen: torch.Tensor | None = None

            def push(self, latents: torch.Tensor) -> torch.Tensor:
                done = 0 if self.seen is None else 1 + 4 * (self.seen.shape[2] - 1)
                self.seen = latents if self.seen is None else torch.cat([self.seen, latents], dim=2)
                return vae.decode_pixels(self.seen)[:, :, done:]

        return Stream()

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.avg_pool2d(video[:, :, 0], 8)
        return torch.einsum("co,bohw->bchw", self.down, pooled)[:, :, None]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_digest(tensor: torch.Tensor) -> str:
    tensor = tensor.detach().cpu().contiguous()
    head = f"{tensor.dtype}{tuple(tensor.shape)}".encode()
    raw = tensor.view(torch.uint8) if tensor.dtype == torch.bfloat16 else tensor
    return _sha(head + raw.numpy().tobytes())


def table_digest(table: pd.DataFrame | None, digest) -> None:
    if table is None:
        digest.update(b"none")
        return
    digest.update(f"{list(table.columns)}{len(table)}".encode())
    for name in table.columns:
        column = table[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            digest.update(repr(list(column.cat.categories)).encode())
            digest.update(np.ascontiguousarray(column.cat.codes.to_numpy()).tobytes())
        elif column.dtype == object:
            for value in column:
                digest.update(np.ascontiguousarray(np.asarray(value)).tobytes() if value is not None else b"None")
        else:
            digest.update(str(column.dtype).encode())
            digest.update(np.ascontiguousarray(column.to_numpy()).tobytes())


def _contexts(case: Case, text_dim: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    embeddings = [torch.randn(1, 5, text_dim, generator=g, dtype=torch.float64).to(dtype) for _ in case.segments]
    if len(case.segments) == 1 and case.model != "5b":
        return embeddings[0]
    return [(start, embedding, text) for (start, text), embedding in zip(case.segments, embeddings)]


def run_case(case: Case, graphs: bool = False) -> dict[str, str]:
    """The case's hashes (see the module docstring); ``graphs``: the layers replayed through
    ``layer_graphs.RerunPieces``, the CUDA graphs' data flow on the CPU."""
    dtype = getattr(torch, case.dtype)
    config = MODELS[case.model]
    model = build_model(config, seed=5, dtype=dtype)
    if graphs:
        model.layer_graphs = LayerGraphs(RerunPieces())
    options = GenerationOptions.from_config(case.generation)
    context = _contexts(case, config.text_dim, dtype)
    vae = StandInVAE(config.in_dim, dtype) if case.vae else None
    capture = FrameStatsCapture(
        model, range(config.num_layers), frame_seq_length=config.frame_seq_length(), token_profiles="all"
    )
    with capture:
        result = generate(model, context, options=options, seed=case.seed, observers=[capture], vae=vae)
    rows = hashlib.sha256()
    for layer, tables in sorted(capture.layer_tables().items()):
        rows.update(f"layer{layer}".encode())
        for kind in sorted(tables):
            rows.update(kind.encode())
            table_digest(tables[kind], rows)
    if graphs:
        print(f"  {model.layer_graphs.backend.replays} pieces replayed", flush=True)
    calls = [
        (c.block, c.pass_, c.step, c.timestep, c.start_frame, c.num_frames, c.is_last_block, c.segment)
        for c in result.calls
    ]
    return {
        "latents": tensor_digest(result.latents),
        "rows": rows.hexdigest(),
        "calls": _sha(json.dumps(calls).encode()),
        "options": _sha(json.dumps(options.to_dict()).encode()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the hashes here (JSON)")
    parser.add_argument("--compare", type=Path, help="compare with the hashes in this JSON file")
    parser.add_argument("--cases", nargs="+", help="only these cases")
    parser.add_argument("--list", action="store_true", help="name the cases and stop")
    parser.add_argument(
        "--graphs", action="store_true", help="replay the layers as CUDA graphs would (layer_graphs.RerunPieces)"
    )
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    torch.set_num_threads(1)
    names = args.cases or list(CASES)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; --list names them")
    hashes: dict[str, dict[str, str]] = {}
    for name in names:
        hashes[name] = run_case(CASES[name], args.graphs)
        print(f"{name}: latents {hashes[name]['latents'][:16]} rows {hashes[name]['rows'][:16]}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(hashes, indent=1) + "\n")
    if args.compare is not None:
        expected = json.loads(args.compare.read_text())
        if args.cases:
            expected = {name: value for name, value in expected.items() if name in names}
        differ = sorted(name for name in set(expected) | set(hashes) if expected.get(name) != hashes.get(name))
        for name in differ:
            got, want = hashes.get(name, {}), expected.get(name, {})
            keys = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            print(f"DIFFERS {name}: {', '.join(keys) or 'missing'}")
        print(f"{len(hashes) - len(differ)} of {len(set(expected) | set(hashes))} cases identical")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
