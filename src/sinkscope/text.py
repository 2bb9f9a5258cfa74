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
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .io import atomic_path

if TYPE_CHECKING:
    from .config import CheckpointSpec

WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER_DIR = os.path.join("google", "umt5-xxl")
MAX_TOKENS = 512


@dataclass(frozen=True)
class TextEncoderSpec:
    """Which encoder turns prompts into a checkpoint's context."""

    kind: str  # "demo" or "umt5"
    layout: str | None = None  # "wan" or "diffusers" for umT5
    folder: str | None = None
    text_dim: int = 4096
    text_len: int = 512

    @property
    def key(self) -> str:
        """A short, path-safe name for the encoder (a wildcard of the workflow)."""
        if self.kind == "demo":
            return f"demo-{self.text_dim}x{self.text_len}"
        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", Path(self.folder).name) or "umt5"
        digest = hashlib.sha256(str(Path(self.folder).resolve()).encode()).hexdigest()[:6]
        return f"umt5-{name}-{digest}"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def files(self) -> list[str]:
        """The files the encoder is made of (inputs of the encoding job)."""
        if self.kind == "demo":
            return []
        folder = Path(self.folder)
        if self.layout == "wan":
            parts = [folder / WAN_T5_FILE, *sorted((folder / WAN_TOKENIZER_DIR).rglob("*"))]
        else:
            parts = sorted((folder / "text_encoder").rglob("*")) + sorted((folder / "tokenizer").rglob("*"))
        return [str(p) for p in parts if p.is_file()]


def text_encoder_for(spec: "CheckpointSpec", text_dim: int, text_len: int, base_dir: str | Path = ".") -> TextEncoderSpec:
    """The encoder of a checkpoint entry; raises FileNotFoundError naming what is missing."""
    if spec.is_demo:
        return TextEncoderSpec("demo", text_dim=text_dim, text_len=text_len)
    candidates = []
    for entry in (spec.base, spec.weights):
        if entry:
            path = Path(entry).expanduser()
            path = path if path.is_absolute() else Path(base_dir) / path
            candidates.append(path)
    for folder in candidates:
        layout = umt5_layout(folder)
        if layout:
            return TextEncoderSpec("umt5", layout, str(folder), text_dim=text_dim, text_len=text_len)
    where = ", ".join(str(c) for c in candidates) or "no folder"
    raise FileNotFoundError(
        f"no umT5 text encoder found ({where}); set 'base' to the Wan2.1 release folder "
        f"(with {WAN_T5_FILE} and {WAN_TOKENIZER_DIR}/) or to a diffusers folder (text_encoder/, tokenizer/)"
    )


def umt5_layout(folder: Path) -> str | None:
    if not folder.is_dir():
        return None
    if (folder / WAN_T5_FILE).is_file() and (folder / WAN_TOKENIZER_DIR).is_dir():
        return "wan"
    if (folder / "text_encoder" / "config.json").is_file() and (folder / "tokenizer").is_dir():
        return "diffusers"
    return None


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

    from .model.loading import torch_load

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
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(
            {"context": context.contiguous().float()},
            str(tmp),
            metadata={"prompt": prompt, "encoder": encoder.key},
        )


def load_embedding(path: str | Path) -> tuple[torch.Tensor, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return handle.get_tensor("context"), dict(handle.metadata() or {})
