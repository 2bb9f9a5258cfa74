"""Self-Forcing's block procedure (``generation.procedure: self_forcing``; its
``CausalInferencePipeline.inference``, T2V), declared on ``generation.loop``.

- the video's latent frames are generated block by block (3 frames a block, or
  [1, 3, 3, ...] with an independent first frame);
- per block, the few-step DMD sampler (``steps.DMDSteps``): a call per step, re-noising
  between steps; the first block may have steps of its own (Causal Forcing++: 4 for block
  0, then 1 or 2: ``first_block_denoising_steps``);
- the finished block is run once more at the context timestep (0) so that its clean
  keys/values overwrite its slots in the KV cache (``hooks.CachePass``);
- a prompt may switch between blocks (LongLive's interactive generation; ``prompts:``
  schedules), with LongLive's KV re-cache before the block (``hooks.PromptSwitch``).

Every cache policy that takes block calls and needs no other kind runs under it
(``sinkscope.options.block_cache_policies``).
"""

from __future__ import annotations

from sinkscope.generation.hooks import CachePass, PromptSwitch
from sinkscope.generation.loop import Procedure
from sinkscope.generation.procedures import register_procedure
from sinkscope.generation.steps import DMDSteps
from sinkscope.options import SELF_FORCING_PROCEDURE

SELF_FORCING = register_procedure(
    Procedure(SELF_FORCING_PROCEDURE, DMDSteps, before_block=(PromptSwitch,), after_block=(CachePass,))
)
