"""The training objective of one batch: L_HN (or InfoNCE) + lambda * L_tok, on the global batch.

Features are encoded under the run's precision context (bf16 autocast on accelerators) and every
loss is computed in fp32 on them. In a multi-process run the features are gathered first
(`hnclip.losses.distributed`), so each term sees the whole global micro-batch; in one process the
gather is the identity and the computation is exactly the single-batch one.

`objective.margin_control` (absent = none; Table X1's controls, `hnclip.losses.contrastive`) replaces
G_bar by a constant or a shuffled margin matrix. The shuffle of a contrastive group is drawn from its
*margin key* (epoch, micro-batch index within the epoch; in exact-batch mode the group's first) and
the run seed (`with_run_seed`), so it is the same on every path (micro-batch, compute_batch, the
gradient probe), on every rank and after a resume.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Callable, ContextManager

import torch

from hnclip.losses import hn_loss, infonce_loss
from hnclip.losses.distributed import gather_features, global_token_alignment_loss
from hnclip.models.towers import Encoded, encode_batch, encode_text

TOKEN_LOSS_CHUNK = 16  # captions per chunk of the token-level term: bounds its memory at paper scale
Autocast = Callable[[], ContextManager]  # a fresh precision context per forward
MarginKey = tuple[int, int]  # (epoch, micro-batch index within the epoch) of a contrastive group


def as_float32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Upcast bf16/fp16 activations for the losses; fp32 tensors are returned as they are."""
    return tensor if tensor is None or not tensor.is_floating_point() else tensor.float()


def trained_term(objective: dict) -> str:
    """The global term that is back-propagated: L_HN when gamma > 0, else plain InfoNCE."""
    return "hn" if objective["gamma"] > 0 else "infonce"


def margin_control(objective: dict) -> str:
    """none (G_bar itself), constant or shuffled."""
    return objective.get("margin_control", "none")


def with_run_seed(objective: dict, seed: int) -> dict:
    """The objective as a run's losses see it: a shuffled-G run also carries its seed (the first part
    of every group's shuffle); any other objective is returned as it is."""
    return {**objective, "run_seed": int(seed)} if margin_control(objective) == "shuffled" else objective


def margin_generator(objective: dict, margin_key: MarginKey | None) -> torch.Generator | None:
    """The CPU generator of one contrastive group's shuffled margins (None unless G is shuffled):
    seeded from (run seed, epoch, micro-batch index), so a resumed run draws the same permutations."""
    if objective["gamma"] <= 0 or margin_control(objective) != "shuffled":
        return None
    if margin_key is None or "run_seed" not in objective:
        raise ValueError("shuffled margins need the run seed (with_run_seed) and the group's margin key")
    epoch, index = margin_key
    digest = hashlib.blake2b(f"{objective['run_seed']}/{epoch}/{index}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)  # within int64


def frozen_margin_features(frozen_text, tokens: torch.Tensor, objective: dict) -> torch.Tensor | None:
    """Text features of the frozen initial text tower (Table 3c) when G is frozen, else None."""
    if objective["gamma"] <= 0 or objective["margin"] != "frozen":
        return None
    with torch.no_grad():
        return encode_text(frozen_text, tokens)


def contrastive_terms(image_features, text_features, logit_scale, objective: dict,
                      margin_features=None, margin_key: MarginKey | None = None) -> dict[str, torch.Tensor]:
    """The global terms on the gathered batch: `hn` and `infonce` (no gradient: the saturation
    diagnostic of paper Fig. 4, logged even when L_HN is trained), or `infonce` alone (gamma 0).
    `margin_key` identifies the group for a shuffled-G objective (ignored otherwise)."""
    image_features, text_features, margin_features = gather_features(
        as_float32(image_features), as_float32(text_features), margin_features)
    gamma = objective["gamma"]
    if gamma <= 0:
        return {"infonce": infonce_loss(image_features, text_features, logit_scale)}
    terms = {"hn": hn_loss(image_features, text_features, logit_scale, gamma, margin_features,
                           margin_control(objective), margin_generator(objective, margin_key))}
    with torch.no_grad():
        terms["infonce"] = infonce_loss(image_features, text_features, logit_scale)
    return terms


def token_term(encoded: Encoded, logit_scale) -> torch.Tensor:
    """L_tok (FILIP) over the gathered batch."""
    return global_token_alignment_loss(as_float32(encoded.image_tokens), as_float32(encoded.text_tokens),
                                       encoded.text_padding_mask, logit_scale, chunk_size=TOKEN_LOSS_CHUNK)


def group_terms(encoded: Encoded, scale: torch.Tensor, objective: dict,
                margin_features: torch.Tensor | None = None,
                margin_key: MarginKey | None = None) -> dict[str, torch.Tensor]:
    """The objective's named terms on one contrastive group (the features of one micro-batch);
    `total` is what is back-propagated."""
    terms = contrastive_terms(encoded.image_features, encoded.text_features, scale, objective, margin_features,
                              margin_key)
    total = terms[trained_term(objective)]
    if objective["lambda_tok"] > 0:
        terms["tok"] = token_term(encoded, scale)
        total = total + objective["lambda_tok"] * terms["tok"]
    terms["total"] = total
    return terms


def loss_terms(model, images, tokens, objective: dict, frozen_text=None,
               autocast: Autocast = contextlib.nullcontext,
               margin_key: MarginKey | None = None) -> dict[str, torch.Tensor]:
    """The objective's named terms for one micro-batch (its forward, then `group_terms`)."""
    with autocast():
        encoded = encode_batch(model, images, tokens, with_tokens=objective["lambda_tok"] > 0)
        margin_features = frozen_margin_features(frozen_text, tokens, objective)
    return group_terms(encoded, model.logit_scale.exp(), objective, margin_features, margin_key)
