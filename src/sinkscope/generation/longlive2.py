"""LongLive 2.0's chunk procedure (``generation.procedure: longlive2``).

Its inference (L ``pipeline/causal_diffusion_inference.py`` 532-699), T2V, guidance 1:

- the video's latent frames are generated chunk by chunk (8 frames a chunk);
- per chunk, a new UniPC flow sampler (``sinkscope.generation.unipc``; 4 steps, shift 5:
  t = 999, 937, 833, 624): one call per step on the chunk's slice of the noise, the
  velocity straight into the sampler, no noise drawn between steps;
- the finished chunk runs once more at t = 0 (the clean pass, ``pass`` = ``cache``),
  writing its keys and values into the cache;
- a chunk (other than chunk 0) whose prompt starts with ``SCENE_CUT_PREFIX`` ("The scene
  transitions. ") starts a new shot: its RoPE positions move on by 8 a shot from its first
  call, and after its clean pass it is pinned as the shot sink
  (``sinkscope.model.policies.LongLive2Policy``).

A chunk's prompt is the prompt segment active at its first frame; prompt segments switch
at chunk starts (``prompts:`` schedules). Every chunk of a segment whose text starts with
the prefix counts as a cut, as their code checks each chunk's own prompt; their datasets
give the prefix to a shot's first chunk only, so write such a shot as a one-chunk segment
with the prefix followed by a segment without it. The cut needs the texts: a prompt
schedule passed as (start frame, embedding, text) entries (the extraction job passes
them); without texts no chunk is a cut.

Noise: one draw of [frames, C, H, W] from a seeded CPU generator for the whole video
(LongLive draws it in bf16 on CUDA, so the values differ from theirs); each chunk takes
its slice. Their cross-attention recomputes the prompt's keys and values on every call;
here they are computed once per prompt segment (the same numbers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sinkscope.generation.hooks import CachePass, PromptSwitch
from sinkscope.generation.loop import Procedure, Run
from sinkscope.generation.procedures import register_procedure
from sinkscope.generation.steps import UniPCSteps
from sinkscope.options import LONGLIVE2

# Their scene_cut_prefix default (L utils/dataset.py:22).
SCENE_CUT_PREFIX = "The scene transitions. "


def prompt_texts(context: torch.Tensor | Sequence[tuple]) -> list[str | None]:
    """The text of every prompt segment of a schedule (None where an entry carries none)."""
    if isinstance(context, torch.Tensor):
        return [None]
    return [str(entry[2]) if len(entry) > 2 and entry[2] is not None else None for entry in context]


def scene_cuts(chunk_starts: Sequence[int], segment_starts: Sequence[int], texts: Sequence[str | None]) -> list[bool]:
    """Per chunk: whether it starts a new shot (its prompt starts with SCENE_CUT_PREFIX;
    never chunk 0, never under a single prompt, as their ``_is_shot_boundary``)."""
    if len(segment_starts) < 2:
        return [False] * len(chunk_starts)
    cuts = []
    for index, start in enumerate(chunk_starts):
        segment = max(i for i, s in enumerate(segment_starts) if s <= start)
        text = texts[segment]
        cuts.append(index > 0 and text is not None and text.startswith(SCENE_CUT_PREFIX))
    return cuts


class SceneCut:
    """LongLive 2.0's shots: before a chunk that starts a new shot its RoPE positions move on
    (``begin_shot``); after its clean pass it is pinned as the shot sink (``pin_block``)."""

    def __init__(self, run: Run) -> None:
        starts = [block.start_frame for block in run.steps.units]
        self.cuts = scene_cuts(starts, [start for start, _ in run.schedule], prompt_texts(run.prompts))

    def before_block(self, run: Run) -> None:
        if self.cuts[run.unit.index]:
            run.policy.begin_shot()

    def after_block(self, run: Run) -> None:
        if self.cuts[run.unit.index]:
            run.policy.pin_block()


LONGLIVE2_CHUNKS = register_procedure(
    Procedure(
        LONGLIVE2,
        UniPCSteps,
        before_block=(PromptSwitch, SceneCut),
        after_block=(CachePass, SceneCut),
    )
)
