"""Writers of real file layouts, with tiny random weights, for format tests.

Each writer produces what a user downloads: the Wan2.1 release folder (original key
names, config.json without text_dim), a Self-Forcing .pt (generator / generator_ema,
keys prefixed "model."), a diffusers WanTransformer3DModel folder (written by diffusers
itself), and the umT5 text encoder in the Wan and the diffusers layouts.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from sinkscope.model import WanConfig, build_model

TINY = WanConfig(
    dim=48,
    ffn_dim=64,
    num_heads=4,
    num_layers=2,
    in_dim=4,
    out_dim=4,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=4,
    latent_width=6,
)


def tiny_state(seed: int = 0, config: WanConfig = TINY) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in build_model(config, seed=seed).state_dict().items()}


def wan_config_json(config: WanConfig = TINY) -> dict:
    """As the release's config.json: WanModel fields, no text_dim."""
    return {
        "_class_name": "WanModel",
        "_diffusers_version": "0.30.0",
        "model_type": "t2v",
        "patch_size": list(config.patch_size),
        "text_len": config.text_len,
        "in_dim": config.in_dim,
        "dim": config.dim,
        "ffn_dim": config.ffn_dim,
        "freq_dim": config.freq_dim,
        "out_dim": config.out_dim,
        "num_heads": config.num_heads,
        "num_layers": config.num_layers,
        "window_size": [-1, -1],
        "qk_norm": True,
        "cross_attn_norm": True,
        "eps": 1e-6,
    }


def write_wan_folder(folder: Path, state: dict[str, torch.Tensor], config: WanConfig = TINY, shards: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(wan_config_json(config)))
    if shards == 1:
        save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
        return folder
    keys = sorted(state)
    weight_map = {}
    for index in range(shards):
        name = f"diffusion_pytorch_model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[index::shards]
        save_file({k: state[k] for k in part}, str(folder / name))
        weight_map.update({k: name for k in part})
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    return folder


def write_self_forcing_pt(
    path: Path, state: dict, ema_state: dict | None = None, extra: dict | None = None, legacy: bool = False
) -> Path:
    """torch.save of {generator, generator_ema, critic}, keys prefixed 'model.' (a WanDiffusionWrapper);
    ``legacy`` writes torch's format before 1.6 (a pickle stream, not a zip archive)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"generator": {f"model.{k}": v for k, v in state.items()}}
    if ema_state is not None:
        data["generator_ema"] = {f"model.{k}": v for k, v in ema_state.items()}
    data["critic"] = {"model.head.head.weight": torch.zeros(2, 2)}
    data.update(extra or {})
    torch.save(data, path, _use_new_zipfile_serialization=not legacy)
    return path


def diffusers_model(config: WanConfig = TINY, seed: int = 0):
    from diffusers import WanTransformer3DModel

    from sinkscope.model import init_random_weights

    model = WanTransformer3DModel(
        patch_size=config.patch_size,
        num_attention_heads=config.num_heads,
        attention_head_dim=config.head_dim,
        in_channels=config.in_dim,
        out_channels=config.out_dim,
        text_dim=config.text_dim,
        freq_dim=config.freq_dim,
        ffn_dim=config.ffn_dim,
        num_layers=config.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=config.eps,
        rope_max_seq_len=1024,
    )
    return init_random_weights(model, seed).eval()


# -- umT5 -------------------------------------------------------------------------------

WORDS = "a majestic eagle soaring through cloudy sky cinematic lighting neon city street at night rain".split()


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def tiny_umt5(d_model: int = 16, seed: int = 0):
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    config = UMT5Config(
        vocab_size=len(WORDS) + 3,
        d_model=d_model,
        d_kv=4,
        d_ff=24,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        use_cache=False,
        tie_word_embeddings=False,
        layer_norm_epsilon=1e-6,
    )
    model = UMT5EncoderModel(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # norm weights away from 1, so a key mix-up shows
            param.add_(0.05 * torch.randn_like(param))
    return model


def to_wan_t5_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' UMT5EncoderModel keys -> the Wan .pth names (written independently of sinkscope.model.text)."""
    out = {}
    names = {
        "layer.0.layer_norm": "norm1",
        "layer.0.SelfAttention.q": "attn.q",
        "layer.0.SelfAttention.k": "attn.k",
        "layer.0.SelfAttention.v": "attn.v",
        "layer.0.SelfAttention.o": "attn.o",
        "layer.0.SelfAttention.relative_attention_bias": "pos_embedding.embedding",
        "layer.1.layer_norm": "norm2",
        "layer.1.DenseReluDense.wi_0": "ffn.gate.0",
        "layer.1.DenseReluDense.wi_1": "ffn.fc1",
        "layer.1.DenseReluDense.wo": "ffn.fc2",
    }
    for key, value in state.items():
        if key == "shared.weight":
            out["token_embedding.weight"] = value
        elif key == "encoder.final_layer_norm.weight":
            out["norm.weight"] = value
        elif key.startswith("encoder.block."):
            _, _, index, rest = key.split(".", 3)
            stem = rest.rsplit(".", 1)[0]
            out[f"blocks.{index}.{names[stem]}.weight"] = value
    return out


def write_umt5(folder: Path, layout: str, model=None) -> Path:
    """A text encoder folder: 'wan' (models_t5_umt5-xxl-enc-bf16.pth + google/umt5-xxl/) or 'diffusers'."""
    model = model or tiny_umt5()
    tokenizer = tiny_tokenizer()
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "wan":
        torch.save(to_wan_t5_keys(model.state_dict()), folder / "models_t5_umt5-xxl-enc-bf16.pth")
        tokenizer.save_pretrained(folder / "google" / "umt5-xxl")
    else:
        model.save_pretrained(folder / "text_encoder")
        tokenizer.save_pretrained(folder / "tokenizer")
    return folder
