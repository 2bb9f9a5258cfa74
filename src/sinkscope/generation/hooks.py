"""The hooks the block procedures share (steps 3.0 and 3.3 of ``generation.loop``).

- ``PromptSwitch`` (before a block): at a block where the prompt schedule switches, the
  new prompt's cross-attention K/V (computed by the next call) and, with ``re_cache``
  under a policy that re-caches, LongLive's KV re-cache: one more call (pass
  ``recache``), before the block, runs the last min(W, F) generated frames (every frame
  under ``global``) through the model under the new prompt at the context timestep,
  overwriting the keys/values the cache keeps of them (the sink's excepted, as LongLive's
  ``global_sink``; ``CachePolicy.begin_recache``).
- ``CachePass`` (after a block): Self-Forcing's cache pass: the finished block once more
  at the context timestep (0), so that its clean keys/values overwrite its slots.
"""

from __future__ import annotations

import torch

from sinkscope.generation.common import PASS_CACHE, PASS_RECACHE, CallInfo, latents_to_device, synchronize
from sinkscope.generation.loop import Run


class PromptSwitch:
    """Before a block: the prompt segment that starts there, and LongLive's re-cache."""

    def __init__(self, run: Run) -> None:
        self.switches = {start: index for index, (start, _) in enumerate(run.schedule) if index}

    def before_block(self, run: Run) -> None:
        block, options = run.unit, run.options
        start = block.start_frame
        if start not in self.switches:
            return
        # The new prompt's cross-attention K/V, computed by the next call.
        run.segment = self.switches[start]
        run.policy.cache.forget_context()
        if not options.recaches:
            return
        count = options.recache_frames(start)
        synchronize(run.device)  # the finished blocks' host copies are complete
        kept = latents_to_device(
            torch.cat(run.outputs, dim=2)[0, :, start - count : start].transpose(0, 1), run.device, run.dtype
        )
        noise = float(options.context_noise)
        run.announce(CallInfo(block.index, PASS_RECACHE, 0, noise, start - count, count, block.last, run.segment))
        run.policy.begin_recache(start - count, count)
        run.model(
            kept,
            torch.full((1, count), noise, device=run.device),
            run.contexts[run.segment],
            cache_policy=run.policy,
            start_frame=start - count,
            cache_only=True,
        )


class CachePass:
    """After a block: its clean latents once more at the context timestep, so the cache holds
    its clean K/V (the call's output is not read: ``cache_only``)."""

    def __init__(self, run: Run) -> None:
        pass

    def after_block(self, run: Run) -> None:
        block = run.unit
        noise = float(run.options.context_noise)
        run.announce(
            CallInfo(
                block.index,
                PASS_CACHE,
                run.steps.num_steps(block),
                noise,
                block.start_frame,
                block.num_frames,
                block.last,
                run.segment,
            )
        )
        run.model(
            run.prediction,
            torch.full((1, block.num_frames), noise, device=run.device),
            None,
            cache_policy=run.policy,
            start_frame=block.start_frame,
            cache_only=True,
        )
