"""KV-cache policies of long-video generation: what the cache keeps, and at which RoPE position.

Each policy is one small class around a policy-free ``KVCache`` (``model/cache.py``).
The model calls it twice per self-attention call:

- ``begin_call(start_frame, num_frames)``, once per model call, before the layers run:
  block bookkeeping, and everything that is the same for every layer (make room, FIFO
  eviction, moving sink keys to another RoPE position);
- ``attend(layer, q, k, v, raw_k)``, per layer: store the block's keys (first call of
  the block, or an overwrite by a later step / the cache pass), do what needs this
  layer's queries (participative compression), and return every key/value the softmax
  sees. ``layout(layer)`` names them by absolute frame (for attention observers).

The calls come in kinds (``sinkscope.options.CallKind``), and a policy takes the kinds its
spec names. Block calls, Self-Forcing's (its ``causal_inference.py``): per block, one call
per denoising step and one cache pass, all with the same start frame; the first call of a
new block is the only one that evicts or compresses. The other kinds are announced to
the policy before their call: LongLive's re-cache (``begin_recache``), Krea's recompute
(``KreaRecomputePolicy.begin_recompute``), LongLive 2.0's shots (``begin_shot``,
``pin_block``), Rolling Forcing's window and cache update (``begin_window``,
``begin_cache_update``). What each policy does, and where it follows which reference
code, is in docs/cache-policies.md.

Each policy is one entry: its spec is its row of ``sinkscope.options.CACHE_POLICY_TABLE``
(defaults, keys, the calls it takes, cache size, keys of its own; torch-free, for
planning), its code one class registered under the same name with ``@register_policy``
(``POLICY_CLASSES``), built from the ``PolicySettings`` its constructor takes
(``settings_keys``) and its own keys (the spec's ``OptionSpec``s). Importing this package
imports every module of its folder (``sinkscope.discovery``), which fills the registry: a
new policy's module needs no import line. ``new_policy`` sizes the cache by the spec and
builds the class. The classes: ``GlobalPolicy``, ``WindowPolicy``,
``SinkPolicy`` (``base``); ``ParticipativeCompressionPolicy`` (``compression``);
``DeepSinkPolicy``, ``ReropeSinkPolicy``, ``RollingSinkPolicy``, ``RelativeRopePolicy``,
``EmaSinkPolicy`` (``sinks``); ``RollingForcingPolicy`` (``rolling_forcing``);
``KreaRecomputePolicy`` (``krea``); ``LongLive2Policy`` (``longlive2``).

Queries and new keys are roped at their absolute frame, except where a window policy
takes on the relative-RoPE part (``sinks.RelativeRope``: ``relative_rope``, ``ema_sink``,
LongLive 2.0 under ``use_relative_rope``): there the cache holds keys before RoPE, every
key is roped at its slot in the cache at each call, and the queries at the block's slots
(``query_position_shift``), so no position grows past the cache.
"""

from sinkscope.discovery import import_submodules
from sinkscope.model.policies.base import (
    EMA_DECAY,
    FLUSH_KEEP_FRAMES,
    MAX_REUSE,
    POLICY_CLASSES,
    CachePolicy,
    GlobalPolicy,
    PolicySettings,
    SinkPolicy,
    WindowPolicy,
    register_policy,
)
from sinkscope.model.policies.compression import ParticipativeCompressionPolicy
from sinkscope.model.policies.krea import KreaRecomputePolicy
from sinkscope.model.policies.longlive2 import LongLive2Policy
from sinkscope.model.policies.registry import (
    generation_edits,
    new_policy,
    policy_from_options,
)
from sinkscope.model.policies.rolling_forcing import RollingForcingPolicy
from sinkscope.model.policies.sinks import (
    DeepSinkPolicy,
    EmaSinkPolicy,
    RelativeRopePolicy,
    ReropeSinkPolicy,
    RollingSinkPolicy,
)

# Every module of this package is imported, in name order: importing a policy's module
# registers its classes, so a new one needs no line here (the names above are re-exports).
import_submodules(__name__, __path__)

__all__ = [
    "EMA_DECAY",
    "FLUSH_KEEP_FRAMES",
    "MAX_REUSE",
    "POLICY_CLASSES",
    "CachePolicy",
    "DeepSinkPolicy",
    "EmaSinkPolicy",
    "GlobalPolicy",
    "KreaRecomputePolicy",
    "LongLive2Policy",
    "ParticipativeCompressionPolicy",
    "PolicySettings",
    "RelativeRopePolicy",
    "ReropeSinkPolicy",
    "RollingForcingPolicy",
    "RollingSinkPolicy",
    "SinkPolicy",
    "WindowPolicy",
    "generation_edits",
    "new_policy",
    "policy_from_options",
    "register_policy",
]
