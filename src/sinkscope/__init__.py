"""sinkscope: where does an autoregressive video diffusion transformer look?

Attention-sink analysis of block-causal video diffusion transformers (Self-Forcing on
Wan2.1-T2V-1.3B and its family), packaged as a Snakemake pipeline. The package is
layered; a module imports only from its own layer or the ones below it
(``tests/test_architecture.py`` checks this, docs/architecture.md draws it):

1. base: ``errors``, ``io`` (atomic files), ``naming`` (labels, layer groups, file
   names, stable hashes), ``options`` (the generation options and the table of cache
   policies), ``tables`` (Parquet schemas and verified I/O).
2. ``model`` (the Wan2.1 transformer, KV cache, cache policies, checkpoints, weight
   loading, text encoders) and ``stats`` (per-call statistics and derived summaries).
3. ``generation``: the KV-cache generation procedure and the capture of its attention.
4. ``legacy`` (older ``.pt`` caches), ``demo`` (the demo model's data and training),
   ``figures`` (every figure and the summary page) and ``plot`` (one-line plotting).
5. ``pipeline``: config validation, study planning, code digests, integrity, and the
   job functions the Snakemake rules call.
6. ``cli``: the ``sinkscope`` command.
"""

__version__ = "0.1.0"
