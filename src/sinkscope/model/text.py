"""Prompt encoding: the umT5-XXL encoder of Wan2.1, or the demo's seeded embedding.

A prompt is encoded once per text encoder and stored as safetensors
(``context`` [tokens <= text_len, text_dim], float32); the transformer zero-pads it to
``text_len`` rows, as Wan does. Two layouts hold the umT5 encoder:

- the Wan release folder: ``models_t5_umt5-xxl-enc-bf16.pth`` (Wan key names, renamed
  here to transformers' ``UMT5EncoderModel`` names) and the ``google/umt5-xxl/`` tokenizer;
- a diffusers pipeline folder: ``text_encoder/`` and ``tokenizer/``.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sinkscope.io import atomic_path
from sinkscope.model.checkpoints import (
    WAN_T5_FILE,
    WAN_TOKENIZER_DIR,
    TextEncoderSpec,
    resolve_path,
    text_encoder_spec,
    umt5_layout,
)
from sinkscope.model.config import WanConfig

if TYPE_CHECKING:
    from sinkscope.model.checkpoints import CheckpointSpec

__all__ = ["TextEncoderSpec", "encode_prompts", "load_embedding", "save_embedding", "text_encoder_for", "umt5_layout"]

MAX_TOKENS = 512


def text_encoder_for(spec: CheckpointSpec, text_dim: int, text_len: int, base_dir: str | Path = ".") -> TextEncoderSpec:
    """The encoder of a checkpoint entry; raises FileNotFoundError naming what is missing."""
    folders = [p for p in (resolve_path(spec.base, base_dir), resolve_path(spec.weights, base_dir)) if p is not None]
    config = WanConfig(text_dim=text_dim, text_len=text_len)
    return text_encoder_spec(folders, config, demo=spec.is_demo or spec.model == "demo")


# -- the demo encoder --------------------------------------------------------------------


def demo_embedding(text: str, text_dim: int, text_len: int) -> torch.Tensor:
    """A seeded stand-in for umT5: one random row per word plus EOS, seeded by the text."""
    tokens = min(len(clean_prompt(text).split()) + 1, text_len)
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)
    return torch.randn(tokens, text_dim, generator=torch.Generator().manual_seed(seed))


# -- umT5 ----------------------------------------------------------------------------------


def clean_prompt(text: str) -> str:
    """Wan's 'whitespace' cleaning: ftfy (when installed), double HTML unescape, collapse spaces."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def wan_t5_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename Wan's umT5 encoder keys to transformers' UMT5EncoderModel keys."""
    renamed: dict[str, torch.Tensor] = {}
    block_map = {
        "norm1.weight": "layer.0.layer_norm.weight",
        "attn.q.weight": "layer.0.SelfAttention.q.weight",
        "attn.k.weight": "layer.0.SelfAttention.k.weight",
        "attn.v.weight": "layer.0.SelfAttention.v.weight",
        "attn.o.weight": "layer.0.SelfAttention.o.weight",
        "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
        "norm2.weight": "layer.1.layer_norm.weight",
        "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
        "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",
        "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
    }
    for key, value in state.items():
        if key == "token_embedding.weight":
            renamed["shared.weight"] = value
            renamed["encoder.embed_tokens.weight"] = value
        elif key == "norm.weight":
            renamed["encoder.final_layer_norm.weight"] = value
        elif match := re.match(r"^blocks\.(\d+)\.(.+)$", key):
            index, rest = match.groups()
            if rest not in block_map:
                raise ValueError(f"unexpected key {key!r} in the Wan umT5 weights")
            renamed[f"encoder.block.{index}.{block_map[rest]}"] = value
        else:
            raise ValueError(f"unexpected key {key!r} in the Wan umT5 weights")
    return renamed


def umt5_config_from_wan_state(state: dict[str, torch.Tensor]):
    """A transformers UMT5Config sized from the Wan state dict's shapes."""
    from transformers import UMT5Config

    vocab, d_model = state["token_embedding.weight"].shape
    buckets, heads = state["blocks.0.pos_embedding.embedding.weight"].shape
    inner = state["blocks.0.attn.q.weight"].shape[0]
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    return UMT5Config(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=inner // heads,
        d_ff=state["blocks.0.ffn.fc1.weight"].shape[0],
        num_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=buckets,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6,
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
    )


def load_umt5(spec: TextEncoderSpec, *, device: torch.device, dtype: torch.dtype):
    """(tokenizer, UMT5EncoderModel) from a Wan release folder or a diffusers folder."""
    from transformers import AutoTokenizer, UMT5EncoderModel

    from sinkscope.model.loading import torch_load

    folder = Path(spec.folder)
    if spec.layout == "diffusers":
        tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
        encoder = UMT5EncoderModel.from_pretrained(folder / "text_encoder", torch_dtype=dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder / WAN_TOKENIZER_DIR)
        state = torch_load(folder / WAN_T5_FILE, allow_pickle=False)
        config = umt5_config_from_wan_state(state)
        with torch.device("meta"):
            encoder = UMT5EncoderModel(config)
        encoder.load_state_dict(wan_t5_to_transformers(state), strict=True, assign=True)
    return tokenizer, encoder.to(device=device, dtype=dtype).eval().requires_grad_(False)


@torch.inference_mode()
def encode_umt5(texts: list[str], tokenizer, encoder, max_tokens: int = MAX_TOKENS) -> list[torch.Tensor]:
    """Each prompt's [tokens, dim] float32 embedding, trimmed to its true length."""
    batch = tokenizer(
        [clean_prompt(t) for t in texts],
        padding="max_length",
        truncation=True,
        max_length=max_tokens,
        add_special_tokens=True,
        return_tensors="pt",
    )
    device = next(encoder.parameters()).device
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    lengths = mask.sum(dim=1).tolist()
    return [hidden[i, :n].float().cpu() for i, n in enumerate(lengths)]


def encode_prompts(
    spec: TextEncoderSpec, prompts: dict[str, str], *, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """prompt id -> context [tokens, text_dim] float32."""
    if spec.kind == "demo":
        return {pid: demo_embedding(text, spec.text_dim, spec.text_len) for pid, text in prompts.items()}
    device = device or torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tokenizer, encoder = load_umt5(spec, device=device, dtype=dtype)
    ids = list(prompts)
    embeddings = encode_umt5([prompts[i] for i in ids], tokenizer, encoder)
    width = embeddings[0].shape[1]
    if width != spec.text_dim:
        raise ValueError(f"umT5 at {spec.folder} gives width {width}, the transformer expects {spec.text_dim}")
    return {pid: emb[: spec.text_len] for pid, emb in zip(ids, embeddings)}


def save_embedding(path: str | Path, context: torch.Tensor, *, prompt: str, encoder: TextEncoderSpec) -> None:
    """A prompt embedding as safetensors (``context``, float32, with its digest). Written
    here rather than by ``safetensors.save_file``, whose header orders the metadata
    differently from run to run: the same prompt gives the same bytes."""
    context = context.detach().cpu().contiguous().float()
    data = context.numpy().tobytes()
    metadata = {"context_sha256": _tensor_sha256(context), "encoder": encoder.key, "prompt": prompt}
    header = {
        "__metadata__": metadata,
        "context": {"dtype": "F32", "shape": list(context.shape), "data_offsets": [0, len(data)]},
    }
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with atomic_path(path) as tmp:
        tmp.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _tensor_sha256(tensor: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def load_embedding(path: str | Path) -> tuple[torch.Tensor, dict[str, str]]:
    """A prompt embedding and its metadata, its bytes checked against the digest written
    with it (files from before the digest existed load unchecked)."""
    from safetensors import safe_open

    from sinkscope.errors import DamagedFileError

    try:
        with safe_open(str(path), framework="pt") as handle:
            context, metadata = handle.get_tensor("context"), dict(handle.metadata() or {})
    except FileNotFoundError:
        raise
    except Exception as error:  # noqa: BLE001 - safetensors raises its own types for a broken header
        raise DamagedFileError(path, f"not a readable prompt embedding ({str(error).splitlines()[0]})") from None
    expected = metadata.get("context_sha256")
    if expected is not None and _tensor_sha256(context) != expected:
        raise DamagedFileError(path, "the embedding's bytes do not match the digest written with them")
    return context, metadata
