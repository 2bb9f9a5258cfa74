"""Generating a video with the KV-cache procedure, and observing its attention.

- ``sampler``: Self-Forcing's block-causal few-step generation (schedule, noise,
  denoising and cache passes, ``generate``).
- ``rolling``: Rolling Forcing's procedure (a rolling window of blocks denoised jointly),
  which ``generate`` hands over to under ``procedure: rolling_forcing``.
- ``capture``: ``FrameStatsCapture``, the observer that turns each self-attention call
  of the chosen layers into frame statistics.

May import ``sinkscope.model``, ``sinkscope.stats`` and the base modules (``errors``,
``io``, ``naming``, ``options``); nothing from figures, legacy, demo or pipeline.
"""
