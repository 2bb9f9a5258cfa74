"""Generating a video with the KV-cache procedure, and observing its attention.

- ``sampler``: ``generate``, the entry point, which runs the procedure the options name.
- ``loop``: the one generation loop (numbered as Self-Forcing's ``inference()``); a
  procedure (``Procedure``) is a step rule and hooks around it.
- ``steps``: the block step rules (DMD's few steps, LongLive 2.0's UniPC); ``hooks``: the
  hooks the block procedures share (a prompt switch with LongLive's re-cache, the cache pass).
- the procedures, one module and one declaration each: ``self_forcing`` (Self-Forcing's blocks, Causal
  Forcing's first-block steps, LongLive's prompt switches), ``longlive2`` (LongLive 2.0's
  chunks: UniPC steps, the clean pass, scene cuts), ``rolling`` (Rolling Forcing's rolling
  window of blocks denoised jointly), ``krea`` (Krea Realtime 14B: the cache recomputed
  from context frames every block).
- ``procedures``: the registry of procedures (``register_procedure``), named as
  ``sinkscope.options.PROCEDURE_TABLE``.
- ``common``: what the procedures share (flow-matching schedule, noise stream, calls
  announced to observers, host/device moves, clock); ``unipc``: LongLive 2.0's sampler.
- ``capture``: ``FrameStatsCapture``, the observer that turns each self-attention call
  of the chosen layers into frame statistics.

May import ``sinkscope.model``, ``sinkscope.stats`` and the base modules (``errors``,
``io``, ``naming``, ``options``, ``discovery``); nothing from figures, legacy, demo or pipeline.
"""

from sinkscope.discovery import import_submodules

# Every module of this package is imported, in name order: importing a procedure's module
# registers its procedure, so a new one needs no line here.
import_submodules(__name__, __path__)
