"""Synthetic frame_attention rows with a known structure, for table and figure tests."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd


def synthetic_rows(
    seed: int = 0,
    blocks=(3, 3, 3),
    heads: int = 2,
    steps: int = 2,
    checkpoint: str = "ck",
    variant: str = "default",
    prompts=("p",),
    seeds=(0,),
    layers=(3,),
    window: int | None = None,
    sink: int = 0,
) -> pd.DataFrame:
    """frame_attention rows of a block-causal generation with random values.

    ``window``/``sink`` drop the key frames a sliding window with sink frames evicts.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for prompt in prompts:
        for run_seed in seeds:
            for layer in layers:
                start = 0
                for block, size in enumerate(blocks):
                    keys = list(range(start + size))
                    if window is not None:
                        keys = [k for k in keys if k < sink or k >= start + size - (window - sink)]
                    calls = [("denoise", s) for s in range(steps)] + [("cache", steps)]
                    for pass_, step in calls:
                        for head in range(heads):
                            for qf in range(start, start + size):
                                mass = rng.random(len(keys))
                                mass /= mass.sum()
                                share = rng.random(len(keys))
                                share /= share.sum()
                                for kf, m, a in zip(keys, mass, share):
                                    rows.append(
                                        dict(
                                            checkpoint=checkpoint,
                                            variant=variant,
                                            prompt_id=prompt,
                                            seed=run_seed,
                                            layer=layer,
                                            head=head,
                                            block=block,
                                            timestep=0.0 if pass_ == "cache" else 900.0 - 100 * step,
                                            query_frame=qf,
                                            key_frame=kf,
                                            logit_mean=rng.normal(),
                                            prob_mass=m,
                                            argmax_share=a,
                                            key_tokens=24,
                                            key_position_shift=0,
                                            step=step,
                                            prompt_segment=0,
                                            **{"pass": pass_},
                                        )
                                    )
                    start += size
    return pd.DataFrame(rows)


def flip_bytes_and_read(path: Path, trial: int, width: int) -> None:
    """Flip ``width`` bytes of the file at a place chosen by ``trial``, then read it: the
    read must fail naming the file, or give exactly what was written (only the footer's
    column statistics, which a full read does not use, may change without notice)."""
    from sinkscope.errors import DamagedFileError
    from sinkscope.tables import read_arrow

    original = read_arrow(path)
    data = bytearray(path.read_bytes())
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    position = random.Random(trial).randrange(4, len(data) - 12)
    for i in range(width):
        data[position + i] ^= 0xFF
    path.write_bytes(bytes(data))
    try:
        damaged = read_arrow(path)
    except DamagedFileError as error:
        assert path.name in str(error)
        return
    assert position >= footer_start and damaged.equals(original), position


def synthetic_effects(
    layers: int,
    heads: int,
    *,
    frames: int = 21,
    per_block: int = 3,
    runs=(("p", 0), ("p", 1)),
    checkpoint: str = "ck",
    variants=(("no_sink", [(0, 0), (4, 9)]), ("identity", "all"), ("kv_int8", [])),
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """variant_effects and variant_head_effects of ``variants`` (name, edited heads: a list,
    or 'all') against a default run, as sinkscope.pipeline.effects writes them (per-run
    rows and run-averaged rows): latents that move away from the untouched ones after block
    0 (the identity variant not at all), random frame-0 mass changes of the captured heads."""
    from sinkscope.pipeline.effects import frame_blocks, frame_effects, with_run_means
    from sinkscope.tables import EFFECTS_RUN_STD, HEAD_EFFECTS_RUN_STD

    rng = np.random.default_rng(seed)
    frame_parts, head_parts = [], []
    blocks = frame_blocks([per_block] * (frames // per_block), frames)
    for prompt, run_seed in runs:
        reference = rng.normal(size=(4, frames, 3, 5)).astype(np.float32)
        for index, (variant, edited) in enumerate(variants):
            scale = 0.0 if variant == "identity" else 0.02 * (index + 1)
            moved = reference + scale * (blocks > 0)[None, :, None, None] * rng.normal(size=reference.shape)
            effects = frame_effects(moved.astype(np.float32), reference)
            run = dict(checkpoint=checkpoint, variant=variant, prompt_id=prompt, seed=run_seed)
            frame_parts.append(pd.DataFrame(effects).assign(block=blocks, **run))
            named = {(a, b) for a in range(layers) for b in range(heads)} if edited == "all" else set(edited)
            for layer in range(layers):
                for head in range(heads):
                    default_mass, default_entropy = rng.random(), 2 + rng.random()
                    change = (
                        0.0
                        if variant == "identity"
                        else (-default_mass if (layer, head) in named else rng.normal(scale=0.02))
                    )
                    head_parts.append(
                        dict(
                            run,
                            layer=layer,
                            head=head,
                            calls=40,
                            edited=(layer, head) in named,
                            frame0_mass=default_mass + change,
                            frame0_mass_default=default_mass,
                            frame0_mass_change=change,
                            entropy_tokens=default_entropy + change,
                            entropy_tokens_default=default_entropy,
                            entropy_tokens_change=change,
                        )
                    )
    frame_table = with_run_means(
        pd.concat(frame_parts, ignore_index=True), ["checkpoint", "variant", "latent_frame"], EFFECTS_RUN_STD, ["block"]
    )
    head_table = with_run_means(
        pd.DataFrame(head_parts), ["checkpoint", "variant", "layer", "head"], HEAD_EFFECTS_RUN_STD, ["calls", "edited"]
    )
    return {"variant_effects": frame_table, "variant_head_effects": head_table}


def cache_rows(
    layouts,
    *,
    layers=(0,),
    heads: int = 1,
    steps: int = 1,
    checkpoint: str = "ck",
    variant: str = "default",
    runs=(("p", 0),),
) -> pd.DataFrame:
    """frame_attention rows whose key layout is given: ``layouts`` maps each block to (its
    query frames, [(key frame, key_position_shift, key_tokens), ...]); every call of a
    block (``steps`` denoising steps and the cache pass) sees that layout, uniform mass."""
    rows = []
    for prompt, run_seed in runs:
        for layer in layers:
            for block, (queries, keys) in layouts.items():
                for pass_, step in [("denoise", s) for s in range(steps)] + [("cache", steps)]:
                    for head in range(heads):
                        for qf in queries:
                            for kf, shift, tokens in keys:
                                rows.append(
                                    dict(
                                        checkpoint=checkpoint,
                                        variant=variant,
                                        prompt_id=prompt,
                                        seed=run_seed,
                                        layer=layer,
                                        head=head,
                                        block=block,
                                        timestep=0.0 if pass_ == "cache" else 1000.0 - 100 * step,
                                        query_frame=qf,
                                        key_frame=kf,
                                        logit_mean=0.0,
                                        prob_mass=1.0 / len(keys),
                                        argmax_share=1.0 / len(keys),
                                        key_tokens=tokens,
                                        key_position_shift=shift,
                                        step=step,
                                        prompt_segment=0,
                                        **{"pass": pass_},
                                    )
                                )
    return pd.DataFrame(rows)


def synthetic_atlas(
    layers: int,
    heads: int,
    *,
    frames: int = 21,
    per_block: int = 3,
    runs=(("p", 0), ("p", 1)),
    checkpoint: str = "ck",
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """head_atlas, frame_atlas and pruning_curve as sinkscope.pipeline.atlas makes them from
    the variant_effects of four sweeps (every head; every layer; every cached frame; a
    pruning curve) against a default run: a head's drift grows with its untouched frame-0
    mass (heads above 0.5 are sink-class), a frame's with its untouched mass, and masking
    heads in the atlas's order moves the video least."""
    from sinkscope.pipeline.atlas import frame_atlas, head_atlas, pruning_curve
    from sinkscope.pipeline.effects import frame_blocks, frame_effects
    from sinkscope.sweeps import pruning_grid

    rng = np.random.default_rng(seed)
    blocks = frame_blocks([per_block] * (frames // per_block), frames)
    cached = int(np.flatnonzero(blocks == blocks.max())[0])
    mass = rng.beta(0.6, 2.0, size=(layers, heads))
    frame_mass = np.sort(rng.random(cached))[::-1] / cached
    total = layers * heads
    scales = {}
    for layer in range(layers):
        for head in range(heads):
            scales[f"sink_per_head/L{layer + 1}H{head + 1}"] = 0.02 + 0.3 * mass[layer, head] * rng.random()
        scales[f"per_layer/L{layer + 1}"] = 0.05 + 0.3 * mass[layer].mean()
    for frame in range(cached):
        scales[f"cache_per_frame/f{frame}"] = 0.02 + 2.0 * frame_mass[frame]
    for k in pruning_grid(total):
        share = k / total
        if k == total:
            scales[f"prune/all_k{k}"] = 0.5
            continue
        for order, curve in (("drift", share**3), ("random", share), ("frame0_mass", share**1.5)):
            scales[f"prune/{order}_k{k}"] = 0.5 * curve
    parts, head_rows, frame_rows = [], [], []
    for prompt, run_seed in runs:
        reference = rng.normal(size=(2, frames, 2, 2)).astype(np.float32)
        run = dict(checkpoint=checkpoint, prompt_id=prompt, seed=run_seed)
        for variant, scale in scales.items():
            noise = rng.normal(size=reference.shape) * (1 + 0.1 * rng.normal())
            moved = reference + scale * (blocks > 0)[None, :, None, None] * noise
            table = pd.DataFrame(frame_effects(moved.astype(np.float32), reference))
            parts.append(table.assign(block=blocks, variant=variant, **run))
        jitter = rng.normal(scale=0.02, size=mass.shape)
        for layer in range(layers):
            for head in range(heads):
                head_rows.append(
                    dict(run, layer=layer, head=head, frame0_mass_default=mass[layer, head] + jitter[layer, head])
                )
        for frame in range(cached):
            frame_rows.append(dict(run, key_frame=frame, frame_mass_default=frame_mass[frame]))
    effects = pd.concat(parts, ignore_index=True)
    classes = {
        (layer, head): "sink" if mass[layer, head] > 0.5 else "sink?" if mass[layer, head] > 0.45 else "local"
        for layer in range(layers)
        for head in range(heads)
    }
    return {
        "head_atlas": head_atlas(effects, pd.DataFrame(head_rows), classes),
        "frame_atlas": frame_atlas(effects, pd.DataFrame(frame_rows), sink_frames=(0,)),
        "pruning_curve": pruning_curve(effects),
    }
