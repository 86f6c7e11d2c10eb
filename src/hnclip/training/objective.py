"""The training objective of one batch: L_HN (or InfoNCE) + lambda * L_tok, on the global batch.

Features are encoded under the run's precision context (bf16 autocast on accelerators) and every
loss is computed in fp32 on them. In a multi-process run the features are gathered first
(`hnclip.losses.distributed`), so each term sees the whole global micro-batch; in one process the
gather is the identity and the computation is exactly the single-batch one.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch

from hnclip.losses import hn_loss, infonce_loss
from hnclip.losses.distributed import gather_features, global_token_alignment_loss
from hnclip.models.towers import Encoded, encode_batch, encode_text

TOKEN_LOSS_CHUNK = 16  # captions per chunk of the token-level term: bounds its memory at paper scale
Autocast = Callable[[], ContextManager]  # a fresh precision context per forward


def as_float32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Upcast bf16/fp16 activations for the losses; fp32 tensors are returned as they are."""
    return tensor if tensor is None or not tensor.is_floating_point() else tensor.float()


def trained_term(objective: dict) -> str:
    """The global term that is back-propagated: L_HN when gamma > 0, else plain InfoNCE."""
    return "hn" if objective["gamma"] > 0 else "infonce"


def frozen_margin_features(frozen_text, tokens: torch.Tensor, objective: dict) -> torch.Tensor | None:
    """Text features of the frozen initial text tower (Table 3c) when G is frozen, else None."""
    if objective["gamma"] <= 0 or objective["margin"] != "frozen":
        return None
    with torch.no_grad():
        return encode_text(frozen_text, tokens)


def contrastive_terms(image_features, text_features, logit_scale, objective: dict,
                      margin_features=None) -> dict[str, torch.Tensor]:
    """The global terms on the gathered batch: `hn` and `infonce` (no gradient: the saturation
    diagnostic of paper Fig. 4, logged even when L_HN is trained), or `infonce` alone (gamma 0)."""
    image_features, text_features, margin_features = gather_features(
        as_float32(image_features), as_float32(text_features), margin_features)
    gamma = objective["gamma"]
    if gamma <= 0:
        return {"infonce": infonce_loss(image_features, text_features, logit_scale)}
    terms = {"hn": hn_loss(image_features, text_features, logit_scale, gamma, margin_features)}
    with torch.no_grad():
        terms["infonce"] = infonce_loss(image_features, text_features, logit_scale)
    return terms


def token_term(encoded: Encoded, logit_scale) -> torch.Tensor:
    """L_tok (FILIP) over the gathered batch."""
    return global_token_alignment_loss(as_float32(encoded.image_tokens), as_float32(encoded.text_tokens),
                                       encoded.text_padding_mask, logit_scale, chunk_size=TOKEN_LOSS_CHUNK)


def group_terms(encoded: Encoded, scale: torch.Tensor, objective: dict,
                margin_features: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The objective's named terms on one contrastive group (the features of one micro-batch);
    `total` is what is back-propagated."""
    terms = contrastive_terms(encoded.image_features, encoded.text_features, scale, objective, margin_features)
    total = terms[trained_term(objective)]
    if objective["lambda_tok"] > 0:
        terms["tok"] = token_term(encoded, scale)
        total = total + objective["lambda_tok"] * terms["tok"]
    terms["total"] = total
    return terms


def loss_terms(model, images, tokens, objective: dict, frozen_text=None,
               autocast: Autocast = contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """The objective's named terms for one micro-batch (its forward, then `group_terms`)."""
    with autocast():
        encoded = encode_batch(model, images, tokens, with_tokens=objective["lambda_tok"] > 0)
        margin_features = frozen_margin_features(frozen_text, tokens, objective)
    return group_terms(encoded, model.logit_scale.exp(), objective, margin_features)
