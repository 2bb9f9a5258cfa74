"""The Wan2.1 transformer and everything it is built from or loaded with.

- ``config``: named model configs (``WanConfig``) and the state dict's shapes.
- ``wan``: the transformer (``WanModel``); ``cache``: KV cache storage; ``layout``: what
  each attention call sees; ``policies``: the KV-cache policies of long rollouts.
- ``checkpoints``: a config's checkpoint entry resolved and its files checked (no
  torch); ``formats``: the weight formats, each one registered object that detects,
  checks (no torch) and reads its files; ``weightfiles``: paths, headers and the
  torch-side readers; ``lora``: its LoRA adapter read and checked (no torch); ``torchfile``: a
  torch.save archive read without unpickling; ``loading``: weights into the model
  (``load_transformer``, adapters merged); ``text``: prompt encoders.

May import the base modules (``errors``, ``io``, ``naming``, ``options``, ``tables``)
only. Importing ``sinkscope.model`` (or ``model.config``, ``model.checkpoints``) does not
import torch: the Snakefile reads model configs while it parses. The torch-side names
load on first use.
"""

from sinkscope.model.config import MODEL_CONFIGS, WanConfig, get_model_config

__all__ = [
    "KVCache",
    "MODEL_CONFIGS",
    "WanConfig",
    "WanModel",
    "build_model",
    "get_model_config",
    "init_random_weights",
    "load_checkpoint",
    "load_transformer",
]


def __getattr__(name: str):
    # Explicit imports (not importlib) keep the code digest's import scan complete.
    if name == "KVCache":
        from sinkscope.model.cache import KVCache

        return KVCache
    if name in ("WanModel", "build_model", "init_random_weights"):
        from sinkscope.model import wan

        return getattr(wan, name)
    if name in ("load_transformer", "load_checkpoint"):
        from sinkscope.model import loading

        return getattr(loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
