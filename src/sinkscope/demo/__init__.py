"""The demo model: synthetic latent videos and the training that gives the small Wan2.1
a structured attention.

- ``data``: the seeded synthetic data set (latent videos of moving balls, one class a prompt).
- ``objective``: what the model learns: teacher / diffusion forcing, block timesteps.
- ``batches``: one training step's batch (flow matching, or a point of a teacher's ODE
  trajectory) and its loss.
- ``ode``: the ODE stage (teacher trajectories for distillation).
- ``saving``: checkpoints in Self-Forcing's layout.
- ``evaluation``: samples from the real sampler against the data, attention summary.
- ``train``: ``TrainConfig``, the training loop (``train_demo``) and the command line
  (``python -m sinkscope.demo.train``, ``sinkscope train-demo``).

May import the model, generation, statistics and base modules; nothing from figures or
pipeline.
"""
