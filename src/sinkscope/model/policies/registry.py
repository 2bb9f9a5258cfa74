"""Building a policy for a model and its generation options: the cache sized by the
policy's spec, the class registered under its name (``register_policy``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sinkscope.interventions import Edit
from sinkscope.model.cache import KVCache
from sinkscope.model.generation_edits import QUANTIZE_CACHE, REPLACE_FRAMES, GenerationEdits
from sinkscope.model.policies.base import (
    EMA_DECAY,
    MAX_REUSE,
    POLICY_CLASSES,
    CachePolicy,
    PolicySettings,
)
from sinkscope.model.wan import WanModel
from sinkscope.options import (
    CACHE_POLICY_TABLE,
    GenerationOptions,
)


def new_policy(
    model: WanModel,
    cache_policy: str,
    *,
    frame_seq_length: int,
    num_frames: int | None = None,
    local_attn_frames: int = -1,
    sink_frames: int = 0,
    budget_frames: int = 0,
    recent_frames: int = 0,
    largest_block: int | None = None,
    batch_size: int = 1,
    max_reuse: int = MAX_REUSE,
    ema_decay: float = EMA_DECAY,
    flush_every_blocks: int = 0,
    options: Mapping[str, Any] | None = None,
) -> CachePolicy:
    """A policy for ``model`` with a cache sized by the policy (not by the video, when bounded).

    ``global`` holds ``num_frames``; participative compression holds W frames plus room
    for the new block (``largest_block``, default the recent window) while it compresses;
    ``rolling_forcing`` holds W frames plus its anchor (RF: 21 + 3); every other policy
    holds W frames (``PolicySpec.capacity_frames``). ``max_reuse``, ``ema_decay`` and
    ``flush_every_blocks`` are the policies' constants (not config keys), for tests.
    ``options``: the policy's own keys (its spec's ``OptionSpec``s), handed to its class as
    keywords (those not given take their defaults there).
    """
    config = model.config
    if cache_policy not in POLICY_CLASSES:
        raise ValueError(f"unknown cache_policy {cache_policy!r} (known: {', '.join(POLICY_CLASSES)})")
    if not POLICY_CLASSES[cache_policy].bounded and num_frames is None:
        raise ValueError(f"cache_policy {cache_policy!r} needs num_frames (its cache grows with the video)")
    capacity = CACHE_POLICY_TABLE[cache_policy].capacity_frames(
        num_frames=num_frames or 0,
        local_attn_frames=local_attn_frames,
        largest_block=largest_block or recent_frames,
        sink_frames=sink_frames,
    )
    cache = KVCache(
        num_layers=config.num_layers,
        batch_size=batch_size,
        num_heads=config.num_heads,
        head_dim=config.head_dim,
        frame_seq_length=frame_seq_length,
        capacity_frames=capacity,
        dtype=model.dtype,
        device=model.device,
    )
    settings = PolicySettings(
        window_frames=local_attn_frames,
        sink_frames=sink_frames,
        budget_frames=budget_frames,
        recent_frames=recent_frames,
        rope=model.rope,
        max_reuse=max_reuse,
        ema_decay=ema_decay,
        flush_every_blocks=flush_every_blocks,
    )
    return POLICY_CLASSES[cache_policy].build(cache, settings, options or {})


def policy_from_options(
    model: WanModel, options: GenerationOptions, *, frame_seq_length: int, seed: int = 0
) -> CachePolicy:
    """The policy ``generate()`` uses: ``options.cache_policy`` with its resolved frame counts,
    carrying the generation's edits (``options.interventions``, resolved; ``seed``: the run's,
    for replacement noise) when there are any."""
    policy = new_policy(
        model,
        options.cache_policy,
        frame_seq_length=frame_seq_length,
        num_frames=options.num_frames,
        local_attn_frames=options.local_attn_frames,
        sink_frames=options.sink_frames,
        budget_frames=options.budget_frames,
        recent_frames=options.recent_frames,
        largest_block=max(options.block_sizes()),
        options=options.policy_options(),
    )
    if options.interventions:
        policy.edits = generation_edits(options.interventions, policy, seed=seed)
    return policy


def generation_edits(edits: Iterable[Edit], policy: CachePolicy, *, seed: int = 0) -> GenerationEdits:
    """The edits of a generation under ``policy`` (its model's sizes, sink frames and RoPE)."""
    edits = tuple(edits)
    cache = policy.cache
    if policy.spec.rebuilds_keys and any(e.edit in (QUANTIZE_CACHE, REPLACE_FRAMES) for e in edits):
        raise ValueError(
            f"cache_policy {policy.name!r} re-ropes keys from its own un-roped copy, "
            "which quantize_cache and replace_frames do not reach"
        )
    sinks = int(getattr(policy, "sink_frames", 0) or 0)
    return GenerationEdits(
        edits,
        num_layers=cache.num_layers,
        num_heads=cache.k.shape[3],
        sink_frames=tuple(range(sinks)) if sinks > 0 else (0,),
        seed=seed,
        rope=policy.rope,
        raw_keys=policy.raw_keys_every_call,
    )
