"""sinkscope: where does an autoregressive video diffusion transformer look?

Attention-sink analysis of block-causal video diffusion transformers (Self-Forcing on
Wan2.1-T2V-1.3B and its family), packaged as a Snakemake pipeline. The package is
layered, highest first; a module imports only from its own part of the package or a
lower layer (``tests/test_architecture.py`` holds this list and checks it;
docs/architecture.md says what lives where)::

  6  cli                          the `sinkscope` command
  5  pipeline                     config check, study plan, digests, integrity, recovery, jobs
  4  plot                         one-line plotting from a table
  3  legacy demo figures          old .pt caches; the demo model's data and training; every
                                  figure and the summary page
  2  generation                   the KV-cache generation procedures and the capture of their
                                  attention
  1  model stats                  Wan2.1, KV cache, cache policies, checkpoints, loading;
                                  per-call statistics and derived summaries
  0  errors arguments io          leaves shared by everything
     manifests naming names
     options schema schemafile
     discovery tables digests
     tokens attention labels
     interventions
     prompt_schedules sweeps
"""

__version__ = "0.1.0"
