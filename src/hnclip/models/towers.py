"""Forward passes of an open_clip `CLIP` that also return projected token features.

Text sequences are trimmed to the longest non-padding sequence of the batch before the
transformer: the causal mask means trailing padding never influences earlier positions, so the
pooled (EOT) features equal `model.encode_text` on the full 248-token input while costing
O(longest caption) instead of O(context length).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hnclip.config.constants import PAD_ID


@dataclass
class Encoded:
    image_features: torch.Tensor | None = None      # [B, E], L2-normalized
    text_features: torch.Tensor | None = None       # [B, E], L2-normalized
    image_tokens: torch.Tensor | None = None        # [B, P, E], projected (not normalized)
    text_tokens: torch.Tensor | None = None         # [B, T, E], projected (not normalized)
    text_padding_mask: torch.Tensor | None = None   # [B, T], True at padding


def text_length(tokens: torch.Tensor) -> int:
    """Positions a text forward must keep so every sequence keeps its EOT: up to the batch's last EOT
    (each row's highest id). Not the count of non-padding ids: id 0 is also BPE '!' (as in "reads
    'OPEN!'."), so such a caption would lose its EOT. Every trimmed text forward uses this rule."""
    return max(int(tokens.argmax(dim=-1).max().item()) + 1, 1)


def trim_padding(tokens: torch.Tensor) -> torch.Tensor:
    return tokens[:, : text_length(tokens)]


def encode_text(model, tokens: torch.Tensor, with_tokens: bool = False):
    tokens = trim_padding(tokens)
    length = tokens.shape[1]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype)
    x = x + model.positional_embedding[:length].to(cast_dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    x = model.ln_final(x)
    pooled = x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]
    pooled = pooled @ model.text_projection
    if not with_tokens:
        return F.normalize(pooled, dim=-1)
    return F.normalize(pooled, dim=-1), x @ model.text_projection, tokens == PAD_ID


def encode_image(model, images: torch.Tensor, with_tokens: bool = False):
    visual = model.visual
    if not with_tokens:
        return F.normalize(visual(images), dim=-1)
    previous = visual.output_tokens
    visual.output_tokens = True
    try:
        pooled, tokens = visual(images)
    finally:
        visual.output_tokens = previous
    return F.normalize(pooled, dim=-1), tokens @ visual.proj


def encode_batch(model, images: torch.Tensor, tokens: torch.Tensor, with_tokens: bool) -> Encoded:
    if not with_tokens:
        return Encoded(image_features=encode_image(model, images), text_features=encode_text(model, tokens))
    img, img_tok = encode_image(model, images, with_tokens=True)
    txt, txt_tok, pad = encode_text(model, tokens, with_tokens=True)
    return Encoded(img, txt, img_tok, txt_tok, pad)
