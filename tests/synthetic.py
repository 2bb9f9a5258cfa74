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
                                    rows.append(dict(
                                        checkpoint=checkpoint, variant=variant, prompt_id=prompt, seed=run_seed,
                                        layer=layer, head=head, block=block, timestep=0.0 if pass_ == "cache" else 900.0 - 100 * step,
                                        query_frame=qf, key_frame=kf, logit_mean=rng.normal(), prob_mass=m, argmax_share=a,
                                        key_tokens=24, key_position_shift=0, step=step, prompt_segment=0, **{"pass": pass_},
                                    ))  # fmt: skip
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
