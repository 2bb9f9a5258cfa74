"""Generating a video with the KV-cache procedure, and observing its attention.

- ``sampler``: ``generate``, the entry point, which runs the procedure the options name;
  Self-Forcing's block-causal few-step generation (``generate_blocks``).
- ``longlive2``: LongLive 2.0's chunks (UniPC steps, the clean pass, scene cuts).
- ``rolling``: Rolling Forcing's procedure (a rolling window of blocks denoised jointly).
- ``krea``: Krea Realtime 14B's procedure (the cache recomputed from context frames every block).
- ``procedures``: the registry of procedures (``register_procedure``), one function each,
  named as ``sinkscope.options.PROCEDURE_TABLE``.
- ``common``: what the procedures share (flow-matching schedule, noise stream, calls
  announced to observers, host/device moves, clock).
- ``capture``: ``FrameStatsCapture``, the observer that turns each self-attention call
  of the chosen layers into frame statistics.

May import ``sinkscope.model``, ``sinkscope.stats`` and the base modules (``errors``,
``io``, ``naming``, ``options``); nothing from figures, legacy, demo or pipeline.
"""

# Every procedure module is imported here: importing one registers its procedure.
from sinkscope.generation import krea, longlive2, rolling, sampler  # noqa: F401
