"""What the drivers of the authors' own pipelines share (``longlive2_theirs.py``,
``self_forcing_theirs.py``): the import stubs their code needs on a machine without its full
environment, the SDPA stand-in for the FlashAttention calls they make directly, random weights
in place of ``from_pretrained``, a fixed text context, the upstream commit and the timing loop.
No sinkscope import: these run the other project's code only.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch

GiB = 2**30


def tiny_wan(model_type: str, channels: int) -> dict:
    """CausalWanModel keyword arguments of a tiny model of a kind (the drivers' ``--quick``
    CPU smoke runs): 2 layers, dim 64, 2 heads, 8 text tokens of 16."""
    return dict(
        model_type=model_type,
        dim=64,
        ffn_dim=96,
        freq_dim=16,
        in_dim=channels,
        out_dim=channels,
        num_heads=2,
        num_layers=2,
        text_len=8,
        text_dim=16,
        eps=1e-6,
    )


# ---------------------------------------------------------------- import stubs
class _AttrDict(dict):
    """Stands in for omegaconf's DictConfig: a dict with attribute access."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key, value):
        self[key] = value


def _wrap(value):
    if isinstance(value, dict):
        return _AttrDict({k: _wrap(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [_wrap(v) for v in value]
    return value


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _merge(a, b):
    out = _wrap(_plain(a))
    for key, value in b.items():
        out[key] = (
            _merge(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else _wrap(value)
        )
    return out


def _omegaconf_stub() -> types.ModuleType:
    import yaml

    class OmegaConf:  # only what the drivers and the configs' readers use
        load = staticmethod(lambda path: _wrap(yaml.safe_load(Path(path).read_text())))
        create = staticmethod(lambda obj=None: _wrap(obj or {}))
        merge = staticmethod(lambda *cfgs: _merge_all(cfgs))
        is_config = staticmethod(lambda obj: isinstance(obj, _AttrDict))
        to_container = staticmethod(lambda obj, resolve=True: _plain(obj))

    def _merge_all(cfgs):
        out = _AttrDict()
        for cfg in cfgs:
            out = _merge(out, cfg)
        return out

    return stub_module("omegaconf", OmegaConf=OmegaConf, DictConfig=_AttrDict, ListConfig=list)


def stub_module(name: str, **attrs) -> types.ModuleType:
    """A module object that importlib.util.find_spec accepts (diffusers probes ftfy)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def not_run(*_args, **_kwargs):
    raise RuntimeError("stubbed by a benchmark driver: this path is not run by the benchmark")


def bare_package(name: str, folder: Path) -> None:
    """Register ``name`` as a package at ``folder`` without running its ``__init__.py`` (which
    imports training or other models' code the inference path does not need)."""
    stub_module(name, __path__=[str(folder)])


def stub_missing(shims: list[str], name: str, why: str, **attrs) -> None:
    """Stub ``name`` only where it does not import; record it in ``shims``."""
    try:
        __import__(name)
    except ImportError:
        if name == "omegaconf":
            _omegaconf_stub()
        else:
            stub_module(name, **attrs)
        shims.append(f"{name}: stub ({why})")


# ---------------------------------------------------------------- attention and weights
def sdpa_flash_attention(
    q,
    k,
    v,
    q_lens=None,
    k_lens=None,
    dropout_p=0.0,
    softmax_scale=None,
    q_scale=None,
    causal=False,
    window_size=(-1, -1),
    deterministic=False,
    dtype=torch.bfloat16,
    version=None,
):
    """Wan's ``flash_attention`` [B, L, N, D] contract on torch SDPA, as its ``attention()``
    fallback computes it; padding lengths and windows are not used by the inference paths."""
    if q_lens is not None or k_lens is not None or tuple(window_size) != (-1, -1):
        raise NotImplementedError("SDPA shim: q_lens/k_lens/window_size are not supported")
    out_dtype = q.dtype
    if q_scale is not None:
        q = q * q_scale
    q, k, v = (x.transpose(1, 2).to(dtype) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, is_causal=causal, scale=softmax_scale
    )
    return out.transpose(1, 2).contiguous().type(out_dtype)


def patch_flash_attention(attention_module, *users) -> str:
    """Route the direct ``flash_attention`` calls of ``attention_module`` and the modules that
    imported it to SDPA where neither FlashAttention 2 nor 3 imports; the attention backend in
    words."""
    if attention_module.FLASH_ATTN_2_AVAILABLE or attention_module.FLASH_ATTN_3_AVAILABLE:
        return "flash_attn (theirs, unpatched)"
    for module in (attention_module, *users):
        module.flash_attention = sdpa_flash_attention
    return "torch SDPA (their attention() fallback; flash_attention shimmed)"


@contextlib.contextmanager
def random_weights(model_class, model_config: dict, device: str, seed: int):
    """While active, ``model_class.from_pretrained(path, **kw)`` builds the model from
    ``model_config`` on ``device`` with its own init instead of reading ``path``."""
    saved = model_class.__dict__.get("from_pretrained")

    def build(cls, _path, **kwargs):
        torch.manual_seed(seed)
        with torch.device(device):
            return cls(**model_config, **kwargs)

    model_class.from_pretrained = classmethod(build)
    try:
        yield
    finally:
        if saved is None:
            del model_class.from_pretrained
        else:
            model_class.from_pretrained = saved


class FixedTextEncoder(torch.nn.Module):
    """Stands in for ``WanTextEncoder``: the same context for every prompt."""

    def __init__(self, context: torch.Tensor):
        super().__init__()
        self.context = context

    def forward(self, text_prompts):
        return {"prompt_embeds": self.context.expand(len(text_prompts), -1, -1)}


def umt5_context(tokens: int, text_len: int, text_dim: int, device: torch.device) -> torch.Tensor:
    """umT5's output for one short prompt: ``text_len`` x ``text_dim`` rows, those past the
    prompt's ``tokens`` zeroed, as their text encoders return it; bf16."""
    generator = torch.Generator(device=device).manual_seed(1)
    context = torch.randn(1, text_len, text_dim, device=device, generator=generator).to(torch.bfloat16)
    context[:, tokens:] = 0
    return context


def upstream_commit(root: Path) -> str:
    stamp = root / "UPSTREAM_COMMIT"  # written by the export into third_party/ (no .git there)
    if stamp.exists():
        return stamp.read_text().strip()
    try:  # a clone: only if root is its own work tree, not a folder of an enclosing repository

        def git(*a):
            return subprocess.run(
                ["git", "-C", str(root), *a], capture_output=True, text=True, check=True
            ).stdout.strip()

        return git("rev-parse", "HEAD") if Path(git("rev-parse", "--show-toplevel")).resolve() == root else "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------- timing
def time_generations(generate: Callable[[], torch.Tensor], reps: int, device: torch.device) -> dict:
    """One warm-up and ``reps`` timed calls of ``generate`` (each between synchronizations,
    its prints sent to stderr); seconds median/min/max, the first run's seconds, the peak of
    ``max_memory_allocated`` over the timed runs and the last latents' shape and finiteness."""
    cuda = device.type == "cuda"
    seconds, peak, first, latents = [], 0, None, None
    for rep in range(reps + 1):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.inference_mode(), contextlib.redirect_stdout(sys.stderr):
            latents = generate()
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - began
        if rep == 0:
            first = elapsed
            continue
        seconds.append(elapsed)
        if cuda:
            peak = max(peak, torch.cuda.max_memory_allocated())
    return {
        "seconds_median": statistics.median(seconds),
        "seconds_min": min(seconds),
        "seconds_max": max(seconds),
        "first_run_seconds": first,
        "peak_gib": peak / GiB if cuda else None,
        "latents_shape": list(latents.shape),
        "latents_finite": bool(torch.isfinite(latents).all()),
    }
