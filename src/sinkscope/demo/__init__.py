"""The demo model: synthetic latent videos and the training that gives the small Wan2.1
a structured attention.

- ``data``: the seeded synthetic data set (latent videos of moving balls, one class a prompt).
- ``train``: flow-matching and ODE-distillation training, evaluation, the command line
  (``python -m sinkscope.train``, ``sinkscope train-demo``).

May import the model, generation, statistics and base modules; nothing from figures or
pipeline.
"""
