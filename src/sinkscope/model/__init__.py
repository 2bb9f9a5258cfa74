"""The Wan2.1 transformer, its named configs, its KV cache, and weight loading."""

from .cache import KVCache
from .config import MODEL_CONFIGS, WanConfig, get_model_config
from .wan import WanModel, build_model, init_random_weights

__all__ = [
    "KVCache",
    "MODEL_CONFIGS",
    "WanConfig",
    "WanModel",
    "build_model",
    "get_model_config",
    "init_random_weights",
]
