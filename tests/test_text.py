"""Prompt encoding: umT5 from the Wan release layout and the diffusers layout; the demo encoder."""

from __future__ import annotations

import hashlib

import pytest
import torch
from fakes import tiny_tokenizer, tiny_umt5, write_umt5

from sinkscope.model.checkpoints import CheckpointSpec
from sinkscope.model.text import (
    TextEncoderSpec,
    clean_prompt,
    demo_embedding,
    encode_prompts,
    load_embedding,
    save_embedding,
    text_encoder_for,
)

pytest.importorskip("transformers")

PROMPTS = {"eagle": "A majestic  eagle soaring through a cloudy sky", "city": "neon city street at night &amp; rain"}


def direct_encoding(model, text, max_tokens=512):
    """What transformers computes for the cleaned prompt, trimmed to its true length."""
    batch = tiny_tokenizer()(
        clean_prompt(text), padding="max_length", max_length=max_tokens, truncation=True, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    return hidden[0, : int(batch.attention_mask.sum())]


def checkpoint(base):
    return CheckpointSpec(
        name="sf",
        model=None,
        format="self_forcing",
        weights="sf.pt",
        base=str(base),
        seed=0,
        ema=True,
        allow_pickle=False,
        dtype="float32",
    )


@pytest.mark.parametrize("layout", ["wan", "diffusers"])
def test_umt5_layouts_encode_like_transformers(tmp_path, layout):
    model = tiny_umt5()
    base = write_umt5(tmp_path / "Wan2.1-T2V-1.3B", layout, model)
    spec = text_encoder_for(checkpoint(base), text_dim=16, text_len=512)
    assert spec.kind == "umt5" and spec.layout == layout
    assert spec.key.startswith("umt5-Wan2.1-T2V-1.3B-")
    assert spec.files() and all(p.startswith(str(base)) for p in spec.files())
    encoded = encode_prompts(spec, PROMPTS)
    for pid, text in PROMPTS.items():
        expected = direct_encoding(model, text)
        assert encoded[pid].dtype == torch.float32
        assert encoded[pid].shape == expected.shape  # true length: words + EOS
        torch.testing.assert_close(encoded[pid], expected, rtol=1e-5, atol=1e-6)
    assert encoded["eagle"].shape[0] == 9  # 8 words + </s>


def test_both_layouts_agree(tmp_path):
    model = tiny_umt5(seed=3)
    wan = encode_prompts(text_encoder_for(checkpoint(write_umt5(tmp_path / "a", "wan", model)), 16, 512), PROMPTS)
    hf = encode_prompts(text_encoder_for(checkpoint(write_umt5(tmp_path / "b", "diffusers", model)), 16, 512), PROMPTS)
    for pid in PROMPTS:
        torch.testing.assert_close(wan[pid], hf[pid], rtol=1e-6, atol=1e-6)


def test_missing_text_encoder_is_named(tmp_path):
    (tmp_path / "base").mkdir()
    with pytest.raises(FileNotFoundError, match="models_t5_umt5-xxl-enc-bf16.pth"):
        text_encoder_for(checkpoint(tmp_path / "base"), 16, 512)


def test_width_mismatch_is_reported(tmp_path):
    base = write_umt5(tmp_path / "base", "wan", tiny_umt5(d_model=16))
    spec = text_encoder_for(checkpoint(base), text_dim=4096, text_len=512)
    with pytest.raises(ValueError, match="gives width 16, the transformer expects 4096"):
        encode_prompts(spec, {"eagle": PROMPTS["eagle"]})


def test_cleaning_follows_wan():
    assert clean_prompt("  a &amp;amp; b \n\t c ") == "a & b c"


def test_demo_embedding_is_seeded_by_the_text():
    a = demo_embedding("a red fox", 8, 32)
    assert a.shape == (4, 8)
    assert torch.equal(a, demo_embedding("a red fox", 8, 32))
    assert not torch.equal(a, demo_embedding("a red cat", 8, 32))
    assert demo_embedding(" ".join(["w"] * 100), 8, 32).shape == (32, 8)


def test_embedding_file_round_trip(tmp_path):
    spec = TextEncoderSpec("demo", text_dim=8, text_len=32)
    context = demo_embedding("a red fox", 8, 32)
    path = tmp_path / "prompts" / "fox.safetensors"
    save_embedding(path, context, prompt="a red fox", encoder=spec)
    loaded, meta = load_embedding(path)
    assert torch.equal(loaded, context)
    assert meta.pop("context_sha256") == hashlib.sha256(context.float().numpy().tobytes()).hexdigest()
    assert meta == {"prompt": "a red fox", "encoder": "demo-8x32"}
