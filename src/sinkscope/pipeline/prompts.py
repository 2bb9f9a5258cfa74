"""The prompt-encoding job: one prompt, one text encoder -> a context embedding file."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from sinkscope.model.text import TextEncoderSpec, encode_prompts, save_embedding
from sinkscope.pipeline.jobs import pick_device


def encode_prompt_job(encoder: dict, prompt_id: str, text: str, output: str | Path, device: str = "auto") -> None:
    """The pipeline's job: one prompt's context embedding for one text encoder."""
    spec = TextEncoderSpec(**encoder)
    began = time.perf_counter()
    target = pick_device(device) if spec.kind != "demo" else torch.device("cpu")
    context = encode_prompts(spec, {prompt_id: text}, device=target)[prompt_id]
    save_embedding(output, context, prompt=text, encoder=spec)
    logging.getLogger("sinkscope").info(
        "encoded prompt %s with %s: %s tokens in %.2f s",
        prompt_id,
        spec.key,
        tuple(context.shape),
        time.perf_counter() - began,
    )
