"""The Wan2.1 text-to-video transformer, written from its public description.

Module and parameter names equal the original Wan checkpoints
(``blocks.N.self_attn.q.weight``, ``head.modulation``, ...), so original-format state
dicts load by name. Precision follows Wan/Self-Forcing where it matters for parity:
RMSNorm and LayerNorm compute in fp32, RoPE tables are built in float64, timesteps are
per latent frame (Self-Forcing's causal variant).

Two ways to call it:

- ``model(latents, timestep, context)``: the full bidirectional forward over every
  frame (optionally with a frame-level attention mask, e.g. block-causal);
- ``model(latents, timestep, context, cache_policy=policy, start_frame=s)``: one causal
  block step of KV-cache inference, as Self-Forcing generates; ``policy`` is a
  ``sinkscope.model.policies.CachePolicy`` (the KV cache and what it keeps; what the model
  asks of it is ``CachePolicyCalls``).

Which kernels it runs on CUDA (config ``capture.kernels``) is the model's field ``kernels``
(a ``sinkscope.attention.settings.KernelSettings``), handed to every layer by the forward.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from sinkscope.attention.biased import edited_attention
from sinkscope.attention.settings import FAST_KERNELS, KernelSettings
from sinkscope.attention.split import balanced_attention
from sinkscope.model.config import WanConfig, get_model_config
from sinkscope.model.layer_graphs import LayerGraphs
from sinkscope.model.layout import AttentionLayout
from sinkscope.model.rope import RotaryTables, apply_rope

if TYPE_CHECKING:
    from sinkscope.model.cache import KVCache


class AttentionObserver(Protocol):
    """Called by a self-attention layer in KV-cache mode with the q, k, v its softmax sees.

    q [B, Lq, H, D], k and v [B, Lk, H, D] exactly as the softmax sees them (after RMSNorm
    and RoPE, k after the cache policy's eviction, compaction and RoPE moves); ``layout``
    names the query frames and, segment by segment in k's order, the key frames. An
    observer that returns an output [B, Lq, H, D] gives the layer's attention (the capture
    returns the model's own call, ``sinkscope.attention.split.cached_attention`` under the
    model's ``kernels``, so the output is unchanged, or with ``capture.attention: fused``
    its own); one that returns None leaves the call to the model. A call whose scores an
    edit changes (``sinkscope.model.generation_edits``) passes the keyword ``frame_bias`` (the
    [H, key segments] float32 bias, ``sinkscope.attention.biased.edited_attention``'s); the
    observers of an edited generation take it.
    """

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: AttentionLayout,
        *,
        frame_bias: torch.Tensor | None = None,
    ) -> torch.Tensor | None: ...


class CachePolicyCalls(Protocol):
    """What a cached call asks of its KV-cache policy (``sinkscope.model.policies.CachePolicy``):
    ``begin_call`` before the layers run, then per layer ``attend`` (store the block's keys,
    return every key/value the softmax sees), ``layout`` (their frames) and, where the
    generation edits attention, ``frame_bias``."""

    cache: KVCache
    edits: object | None
    raw_keys_every_call: bool

    @property
    def wants_raw_keys(self) -> bool: ...

    @property
    def query_position_shift(self) -> int: ...

    def begin_call(self, start_frame: int, num_frames: int, grid: tuple[int, int] | None = None) -> None: ...

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_k: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def layout(self, layer: int) -> AttentionLayout: ...

    def frame_bias(self, layer: int) -> torch.Tensor | None: ...


def sinusoidal_embedding(freq_dim: int, positions: torch.Tensor) -> torch.Tensor:
    """Wan's timestep embedding: [cos(t f), sin(t f)], f = 10000^(-i/half), in float64."""
    half = freq_dim // 2
    positions = positions.to(torch.float64)
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=positions.device) / half)
    angles = torch.outer(positions, freqs)
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


class WanRMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back, then scaled (as Wan does)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return normed.type_as(x) * self.weight


class WanLayerNorm(nn.LayerNorm):
    """LayerNorm in fp32 arithmetic, returned in the input dtype, as the original Wan.

    PyTorch's kernels already compute bf16/fp16 layer norms in fp32 (statistics,
    normalization and affine) and round once at the end, which is what Wan's explicit
    ``x.float()`` ... ``.type_as(x)`` does, without the two extra passes over memory.
    """

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = False) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=elementwise_affine)


class _WanAttention(nn.Module):
    """q, k, v, o projections and the q/k RMSNorms over the full width (Wan's qk_norm)."""

    def __init__(self, dim: int, num_heads: int, eps: float, qk_norm: bool = True) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()
        self.norm_k = WanRMSNorm(dim, eps=eps) if qk_norm else nn.Identity()


class WanSelfAttention(_WanAttention):
    """Self-attention, run in pieces by WanAttentionBlock: project, RoPE, attend, o.

    The pieces let the tensor work around ``attend`` be compiled while the KV-cache
    writes and the observer (the capture hook) stay eager.
    """

    def __init__(self, dim: int, num_heads: int, eps: float, qk_norm: bool = True) -> None:
        super().__init__(dim, num_heads, eps, qk_norm)
        # Set by sinkscope.generation.capture; not part of the state dict.
        self.observer: AttentionObserver | None = None
        self.layer_index = 0

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [B, L, H, D]; q and k RMS-normalized over the full width first."""
        shape = (*x.shape[:2], self.num_heads, self.head_dim)
        q = self.norm_q(self.q(x)).view(shape)
        k = self.norm_k(self.k(x)).view(shape)
        v = self.v(x).view(shape)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache_policy: CachePolicyCalls | None = None,
        attn_mask: torch.Tensor | None = None,
        raw_k: torch.Tensor | None = None,
        kernels: KernelSettings = FAST_KERNELS,
    ) -> torch.Tensor:
        """Attention over the visible keys; [B, L, H*D] before the output projection.

        Kept out of compiled regions: the cache policy stores the block's keys (``raw_k``:
        the same keys before RoPE, for policies that keep some un-roped) and hands back
        every key the softmax sees; the observer gets them with the call's layout. A cached
        call splits its keys where that fills the GPU better, if ``kernels.key_split``.
        """
        if cache_policy is not None:
            k, v = cache_policy.attend(self.layer_index, q, k, v, raw_k)
            if cache_policy.edits is not None:
                bias = cache_policy.frame_bias(self.layer_index)
                if bias is not None:
                    return self._edited(q, k, v, cache_policy.layout(self.layer_index), bias, kernels)
            if self.observer is not None:
                out = self.observer(q, k, v, cache_policy.layout(self.layer_index))
                if out is not None and attn_mask is None:
                    return out.flatten(2)
            if attn_mask is None:
                return balanced_attention(q, k, v, **kernels.attention_call).flatten(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask
        )
        return out.transpose(1, 2).flatten(2)

    def core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache_policy: CachePolicyCalls | None = None,
        keys_only: bool = False,
        **attend_options: Any,
    ) -> torch.Tensor | None:
        """The layer's attention core: ``attend`` (``attend_options``: its ``attn_mask``,
        ``raw_k``, ``kernels``); with ``keys_only`` the call only stores the block's keys (and
        its observer, if any, sees the attention): None."""
        if keys_only and cache_policy is not None and self.observer is None:
            cache_policy.attend(self.layer_index, q, k, v, attend_options.get("raw_k"))
            return None
        attn = self.attend(q, k, v, cache_policy, **attend_options)
        return None if keys_only else attn

    def _edited(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layout: AttentionLayout,
        bias: torch.Tensor,
        kernels: KernelSettings,
    ) -> torch.Tensor:
        """A cached call whose scores an edit changes (``frame_bias`` [H, key segments], see
        ``sinkscope.model.generation_edits``): the observer gets the bias, or the edited attention runs."""
        if self.observer is not None:
            out = self.observer(q, k, v, layout, frame_bias=bias)
            if out is not None:
                return out.flatten(2)
        return edited_attention(q, k, v, bias, layout.key_lengths, **kernels.attention_call)[0].flatten(2)


class WanCrossAttention(_WanAttention):
    """Text-to-video cross-attention: queries from video tokens, keys/values from the text."""

    def context_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*context.shape[:2], self.num_heads, self.head_dim)
        k = self.norm_k(self.k(context)).view(shape).transpose(1, 2)
        v = self.v(context).view(shape).transpose(1, 2)
        return k, v

    def forward(
        self, x: torch.Tensor, context_kv: tuple[torch.Tensor, torch.Tensor], fused_norms: bool = False
    ) -> torch.Tensor:
        if fused_norms_apply(x, fused_norms) and isinstance(self.norm_q, WanRMSNorm):
            from sinkscope.model.block_kernels import qk_norm_rope

            q = qk_norm_rope(self.q(x), self.norm_q.weight, None, self.num_heads, self.norm_q.eps)
        else:
            q = self.norm_q(self.q(x))
        q = q.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, *context_kv)
        return self.o(out.transpose(1, 2).flatten(2))


class WanAttentionBlock(nn.Module):
    def __init__(self, config: WanConfig, layer_index: int) -> None:
        super().__init__()
        dim, eps = config.dim, config.eps
        self.norm1 = WanLayerNorm(dim, eps)
        self.self_attn = WanSelfAttention(dim, config.num_heads, eps, config.qk_norm)
        self.self_attn.layer_index = layer_index
        self.norm3 = WanLayerNorm(dim, eps, elementwise_affine=True) if config.cross_attn_norm else nn.Identity()
        self.cross_attn = WanCrossAttention(dim, config.num_heads, eps, config.qk_norm)
        self.norm2 = WanLayerNorm(dim, eps)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: torch.Tensor,
        context_kv: tuple[torch.Tensor, torch.Tensor],
        cache_policy: CachePolicyCalls | None = None,
        attn_mask: torch.Tensor | None = None,
        keys_only: bool = False,
        kernels: KernelSettings = FAST_KERNELS,
    ) -> torch.Tensor | None:
        """The layer's output; with ``keys_only``, only the self-attention call (its keys reach
        the cache, an observer sees it) and nothing after it: None. ``kernels``: the model's
        kernel settings (``WanModel.kernels``)."""
        before, after = self.step_functions
        raw_k = None
        if cache_policy is not None and cache_policy.wants_raw_keys:
            # A policy that stores some keys un-roped gets both. Rolling Forcing's anchor and
            # Rolling Sink's first window want them in the first blocks' calls only: eager,
            # so compiling needs no second graph. Cache-relative policies want them on every
            # call: the compiled function, specialized once for rope_k=False.
            inputs = before if cache_policy.raw_keys_every_call else WanAttentionBlock.attention_inputs
            q, raw_k, v = inputs(self, x, e0, rope, False, kernels.fused_norms)
            k = apply_rope(raw_k, rope)
        else:
            q, k, v = before(self, x, e0, rope, True, kernels.fused_norms)
        attn = self.self_attn.core(q, k, v, cache_policy, keys_only, attn_mask=attn_mask, raw_k=raw_k, kernels=kernels)
        if attn is None:
            return None
        return after(self, x, attn, e0, *context_kv, kernels.fused_gelu, kernels.fused_norms)

    # The pieces around the self-attention core: pure tensor functions, so that
    # WanModel.compile_blocks can compile them once for all layers.
    @staticmethod
    def attention_inputs(
        block: WanAttentionBlock,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: torch.Tensor,
        rope_k: bool = True,
        fused_norms: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Modulated norm1, q/k/v projections, q/k RMSNorm and RoPE (on k only if ``rope_k``);
        with ``fused_norms`` (``KernelSettings.fused_norms``) where they apply, the norms and
        RoPE in ``sinkscope.model.block_kernels``' kernels."""
        frames = e0.shape[1]
        modulation = block.modulation.unsqueeze(1) + e0
        attn = block.self_attn
        if fused_norms_apply(x, fused_norms) and isinstance(attn.norm_q, WanRMSNorm):
            from sinkscope.model.block_kernels import modulated_norm, qk_norm_rope

            h = modulated_norm(x, modulation[:, :, 0], modulation[:, :, 1], block.norm1.eps)
            shape = (*x.shape[:2], attn.num_heads, attn.head_dim)
            q = qk_norm_rope(attn.q(h), attn.norm_q.weight, rope, attn.num_heads, attn.norm_q.eps)
            k = qk_norm_rope(attn.k(h), attn.norm_k.weight, rope if rope_k else None, attn.num_heads, attn.norm_k.eps)
            return q.view(shape), k.view(shape), attn.v(h).view(shape)
        shift, scale = modulation.chunk(6, dim=2)[:2]
        h = (block.norm1(x).unflatten(1, (frames, -1)) * (1 + scale) + shift).flatten(1, 2)
        q, k, v = attn.project(h)
        return apply_rope(q, rope), apply_rope(k, rope) if rope_k else k, v

    @staticmethod
    def attention_outputs(
        block: WanAttentionBlock,
        x: torch.Tensor,
        attn: torch.Tensor,
        e0: torch.Tensor,
        context_k: torch.Tensor,
        context_v: torch.Tensor,
        fused_gelu: bool = True,
        fused_norms: bool = False,
    ) -> torch.Tensor:
        """Output projection and gate, cross-attention, modulated FFN (``feed_forward``); with
        ``fused_norms`` where they apply, each residual add and the norm after it one kernel."""
        frames = e0.shape[1]
        modulation = block.modulation.unsqueeze(1) + e0
        if fused_norms_apply(x, fused_norms) and isinstance(block.norm3, nn.LayerNorm):
            from sinkscope.model.block_kernels import gated_residual, residual_norm

            gate_sa, shift_ff, scale_ff, gate_ff = (modulation[:, :, i] for i in range(2, 6))
            norm3 = block.norm3
            x, h = residual_norm(x, block.self_attn.o(attn), gate_sa, affine=(norm3.weight, norm3.bias), eps=norm3.eps)
            cross = block.cross_attn(h, (context_k, context_v), fused_norms)
            x, h = residual_norm(x, cross, modulation=(shift_ff, scale_ff), eps=block.norm2.eps)
            return gated_residual(x, feed_forward(block.ffn, h, fused_gelu), gate_ff)
        _, _, gate_sa, shift_ff, scale_ff, gate_ff = modulation.chunk(6, dim=2)

        def per_frame(t: torch.Tensor) -> torch.Tensor:
            return t.unflatten(1, (frames, -1))

        x = x + (per_frame(block.self_attn.o(attn)) * gate_sa).flatten(1, 2)
        x = x + block.cross_attn(block.norm3(x), (context_k, context_v))
        h = (per_frame(block.norm2(x)) * (1 + scale_ff) + shift_ff).flatten(1, 2)
        return x + (per_frame(feed_forward(block.ffn, h, fused_gelu)) * gate_ff).flatten(1, 2)

    step_functions = (attention_inputs, attention_outputs)


def fused_norms_apply(x: torch.Tensor, fused_norms: bool) -> bool:
    """Whether ``sinkscope.model.block_kernels`` runs a block's norms for x: asked for, CUDA,
    fp16 / bf16, inference (the kernels have no backward), eager (a compiled block keeps
    Inductor's fusion: the module docstring says why)."""
    return (
        fused_norms
        and x.is_cuda
        and x.dtype in (torch.float16, torch.bfloat16)
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def feed_forward(ffn: nn.Sequential, h: torch.Tensor, fused_gelu: bool = True) -> torch.Tensor:
    """Wan's FFN (Linear, tanh GELU, Linear) of h [B, L, D].

    With ``fused_gelu`` (``KernelSettings.fused_gelu``), for inference on CUDA in fp16 /
    bf16, the first product and its GELU are one cuBLASLt
    product with a GELU epilogue (``torch._addmm_activation``; cuBLASLt's GELU is the tanh
    form Wan uses, ``benchmarks/block_gemms.py --sections ffn`` checks it): the GELU is
    applied to the fp32 accumulator and rounded once, where the two kernels round twice,
    and a block's 4680 x 8960 hidden values are not written and read again (194 against
    237 us on an H100).
    """
    up, _, down = ffn
    fused = fused_gelu and up.bias is not None and h.is_cuda and h.dtype in (torch.float16, torch.bfloat16)
    if fused and not torch.is_grad_enabled():
        hidden = torch._addmm_activation(up.bias, h.flatten(0, -2), up.weight.t(), use_gelu=True)
        return down(hidden.unflatten(0, h.shape[:-1]))
    return ffn(h)


class Head(nn.Module):
    def __init__(self, config: WanConfig) -> None:
        super().__init__()
        self.norm = WanLayerNorm(config.dim, config.eps)
        self.head = nn.Linear(config.dim, math.prod(config.patch_size) * config.out_dim)
        self.modulation = nn.Parameter(torch.randn(1, 2, config.dim) / config.dim**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor, fused_norms: bool = False) -> torch.Tensor:
        # e: [B, F, dim], the time embedding (not the projection), per frame.
        frames = e.shape[1]
        modulation = self.modulation.unsqueeze(1) + e.unsqueeze(2)
        if fused_norms_apply(x, fused_norms):
            from sinkscope.model.block_kernels import modulated_norm

            return self.head(modulated_norm(x, modulation[:, :, 0], modulation[:, :, 1], self.norm.eps))
        shift, scale = modulation.chunk(2, dim=2)
        h = self.norm(x).unflatten(1, (frames, -1)) * (1 + scale) + shift
        return self.head(h.flatten(1, 2))


class WanModel(nn.Module):
    """Wan2.1 T2V transformer with Self-Forcing's per-frame timesteps and KV-cache steps."""

    def __init__(self, config: WanConfig | str) -> None:
        super().__init__()
        config = get_model_config(config)
        self.config = config
        dim = config.dim
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList([WanAttentionBlock(config, i) for i in range(config.num_layers)])
        self.head = Head(config)
        # A plain attribute, as in Wan: the RoPE tables are not in the state dict.
        self.rope = RotaryTables(config.head_dim, config.rope_max_positions)
        # The kernels every call of this model runs (config capture.kernels); not in the state dict.
        self.kernels: KernelSettings = FAST_KERNELS
        # CUDA graphs of KV-cache calls' layers (kernels.cuda_graphs); not in the state dict.
        self.layer_graphs = LayerGraphs()

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embedding.weight.device

    # -- pieces --------------------------------------------------------------------

    def embed_context(self, context: torch.Tensor) -> torch.Tensor:
        """Zero-pad the text embedding [B, L, text_dim] to text_len rows, then project."""
        text_len = self.config.text_len
        if context.shape[1] > text_len:
            raise ValueError(f"context has {context.shape[1]} tokens, more than text_len {text_len}")
        context = F.pad(context.to(self.dtype), (0, 0, 0, text_len - context.shape[1]))
        return self.text_embedding(context)

    def context_kv(self, context: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Cross-attention K/V of every layer (computed once per generation)."""
        embedded = self.embed_context(context)
        return [block.cross_attn.context_kv(embedded) for block in self.blocks]

    def time_embeddings(self, timestep: torch.Tensor, batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """e [B, F, dim] and e0 [B, F, 6, dim] from scalar, [B] or per-frame [B, F] timesteps."""
        t = torch.as_tensor(timestep, device=self.device)
        if t.ndim == 0:
            t = t.expand(batch)
        if t.ndim == 1:
            t = t[:, None].expand(batch, frames)
        if t.shape != (batch, frames):
            raise ValueError(f"timestep of shape {tuple(t.shape)} does not fit [B={batch}, F={frames}]")
        sinusoid = sinusoidal_embedding(self.config.freq_dim, t.reshape(-1)).to(self.dtype)
        e = self.time_embedding(sinusoid)
        e0 = self.time_projection(e).unflatten(1, (6, self.config.dim))
        return e.unflatten(0, (batch, frames)), e0.unflatten(0, (batch, frames))

    def unpatchify(self, x: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
        """Tokens [B, F*h*w, pt*ph*pw*C] (C fastest) to latents [B, C, F*pt, h*ph, w*pw]."""
        pt, ph, pw = self.config.patch_size
        c = self.config.out_dim
        x = x.view(x.shape[0], frames, height, width, pt, ph, pw, c)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], c, frames * pt, height * ph, width * pw)

    # -- forward -------------------------------------------------------------------

    def forward(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor | float,
        context: torch.Tensor | None = None,
        *,
        cache_policy: CachePolicyCalls | None = None,
        start_frame: int = 0,
        frame_mask: torch.Tensor | None = None,
        cache_only: bool = False,
    ) -> torch.Tensor | None:
        """Velocity (noise - x0) shaped like ``latents`` [B, C, F, H, W].

        Without ``cache_policy``: the full forward over every frame; ``frame_mask`` [F, F]
        (query frame x key frame, True = visible) restricts self-attention, e.g. to
        the block-causal pattern. With ``cache_policy`` (a cache policy): one causal block
        step whose frames start at absolute frame ``start_frame``; ``context`` may then
        be None once the cache holds the cross-attention K/V. ``cache_only`` (a KV-cache step
        whose output nobody reads: Self-Forcing's cache pass): the last layer stops once its
        keys are stored (and its observer, if any, has seen its attention); returns None.
        """
        if latents.ndim != 5:
            raise ValueError(f"latents must be [B, C, F, H, W], got shape {tuple(latents.shape)}")
        x = self.patch_embedding(latents.to(self.dtype))
        batch, _, frames, height, width = x.shape
        x = x.flatten(2).transpose(1, 2)
        e, e0 = self.time_embeddings(timestep, batch, frames)

        attn_mask = None
        position = start_frame
        if cache_policy is not None:
            if frame_mask is not None:
                raise ValueError("frame_mask applies to the full forward, not to KV-cache steps")
            cache_policy.begin_call(start_frame, frames, grid=(height, width))
            # Queries (and the block's keys) at their frame, or where a cache-relative policy puts them.
            position = start_frame + cache_policy.query_position_shift
            store = cache_policy.cache
            if store.cross[0] is None:
                if context is None:
                    raise ValueError("the first KV-cache step needs the text context")
                store.cross = self.context_kv(context)
            cross = store.cross
        else:
            if context is None:
                raise ValueError("the full forward needs the text context")
            cross = self.context_kv(context)
            if frame_mask is not None:
                tokens = height * width
                attn_mask = (
                    frame_mask.to(x.device, torch.bool).repeat_interleave(tokens, 0).repeat_interleave(tokens, 1)
                )
        rope = self.rope.phases(
            position, frames, height, width, x.device, torch.float64 if x.dtype == torch.float64 else torch.float32
        )

        x = self.layers(x, e0, rope, cross, cache_policy, attn_mask, cache_only)
        if x is None:
            return None
        out = self.head(x, e, self.kernels.fused_norms)
        return self.unpatchify(out, frames, height, width)

    def layers(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: torch.Tensor,
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        cache_policy: CachePolicyCalls | None,
        attn_mask: torch.Tensor | None,
        cache_only: bool,
    ) -> torch.Tensor | None:
        """The transformer layers of a call (``forward``): replayed CUDA graphs between the
        attention cores where they apply (``sinkscope.model.layer_graphs``), else eagerly."""
        if self.layer_graphs.applies(x, cache_policy, attn_mask, self.kernels):
            graphed = self.layer_graphs.for_call(self, x, e0, rope, cross)
            if graphed is not None:
                return graphed.run(x, e0, rope, cross, cache_policy, self.kernels, cache_only)
        last = len(self.blocks) - 1
        for index, (block, context_kv) in enumerate(zip(self.blocks, cross)):
            if cache_only and cache_policy is not None and index == last:
                # The last layer's output feeds only the head; the next block needs its keys.
                return block(x, e0, rope, context_kv, cache_policy, keys_only=True, kernels=self.kernels)
            x = block(x, e0, rope, context_kv, cache_policy, attn_mask, kernels=self.kernels)
        return x

    # -- speed and observers ---------------------------------------------------------

    def compile_blocks(self, **options) -> WanModel:
        """torch.compile the tensor work around every self-attention core.

        One compiled pair serves all layers (parameters are graph inputs); the
        attention core, with its KV-cache writes and observers, stays eager.
        """
        before = torch.compile(WanAttentionBlock.attention_inputs, **options)
        after = torch.compile(WanAttentionBlock.attention_outputs, **options)
        for block in self.blocks:
            block.step_functions = (before, after)
        return self

    def set_observer(self, layer: int, observer: AttentionObserver | None) -> None:
        self.blocks[layer].self_attn.observer = observer


def init_random_weights(model: nn.Module, seed: int, device: torch.device | str = "cpu") -> nn.Module:
    """Fill every parameter from one seeded generator on ``device``.

    The default CPU generator makes the weights independent of where the model runs
    (the demo checkpoint); a CUDA generator fills a 1.3B model in a blink (benchmarks).
    Linear/conv weights are Xavier-normal, biases small, norm weights near 1 and
    modulation tables ~ N(0, 1/dim), so a random model has non-trivial attention.
    """
    generator = torch.Generator(device=device).manual_seed(seed)

    def draw(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=generator, device=device)

    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("modulation"):
                values = draw(param.shape) / param.shape[-1] ** 0.5
            elif name.endswith("bias"):
                values = 0.02 * draw(param.shape)
            elif param.ndim == 1:  # RMSNorm / LayerNorm weights
                values = 1.0 + 0.1 * draw(param.shape)
            else:
                fan_out = param.shape[0]
                fan_in = param[0].numel()
                values = (2.0 / (fan_in + fan_out)) ** 0.5 * draw(param.shape)
            param.copy_(values.to(param.dtype))
    return model


def build_model(
    config: WanConfig | str,
    *,
    seed: int | None = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> WanModel:
    """A model of the named config; with ``seed``, seeded random weights (the demo model)."""
    model = WanModel(config)
    if seed is not None:
        init_random_weights(model, seed)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
