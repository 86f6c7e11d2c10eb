"""`recipe.exact_batch`: one accumulation group = one contrastive batch of micro_batch * grad_accum pairs.

By default each micro-batch is its own softmax (16 captions in the paper's recipe) and the group's
gradients are averaged. With exact_batch the global term (L_HN or InfoNCE) is computed over all
pairs of the group at once, with micro-batch activation memory, by `hnclip.losses.gradcache`
(encode without grad, loss on the cached embeddings, re-encode each micro-batch and backprop the
cached embedding gradients). The token term (lambda_tok > 0) stays per micro-batch: a separate
forward per micro-batch, back-propagated as lambda * L_tok / len(group), exactly the scaling of
the default mode. So the group gradient is  d L_global(group) + lambda * mean_m d L_tok(m).
In a multi-process run each rank caches its slices of the group and the loss gathers them: the
global batch is the group's pairs in another order, which the contrastive loss does not depend on.
"""
from __future__ import annotations

import contextlib

import torch

from hnclip.losses import gradcache_backward
from hnclip.losses.objective import (
    Autocast,
    ShuffleKey,
    contrastive_terms,
    frozen_g_features,
    token_term,
    trained_term,
)
from hnclip.models.towers import encode_batch

MicroBatch = tuple[torch.Tensor, torch.Tensor]  # (images, tokens), on the device


def _encoder(model, autocast: Autocast):
    def encode(images, tokens):
        with autocast():
            encoded = encode_batch(model, images, tokens, with_tokens=False)
        return encoded.image_features.float(), encoded.text_features.float()
    return encode


def _group_g_features(frozen_text, batches: list[MicroBatch], objective: dict, autocast: Autocast):
    parts = []
    for _, tokens in batches:
        with autocast():
            parts.append(frozen_g_features(frozen_text, tokens, objective))
    return None if parts[0] is None else torch.cat(parts)


def _global_term_backward(model, batches, objective, frozen_text, autocast,
                          shuffle_key: ShuffleKey | None) -> dict[str, float]:
    g_features = _group_g_features(frozen_text, batches, objective, autocast)
    values: dict[str, float] = {}

    def loss_fn(image_features, text_features, logit_scale):
        terms = contrastive_terms(image_features, text_features, logit_scale, objective, g_features,
                                  shuffle_key)
        values.update({name: float(term.detach()) for name, term in terms.items()})
        return terms[trained_term(objective)]

    gradcache_backward(_encoder(model, autocast), batches, model.logit_scale.exp(), loss_fn)
    return values


def _token_term_backward(model, batches, objective, autocast) -> float:
    weight = objective["lambda_tok"] / len(batches)
    values = []
    for images, tokens in batches:
        with autocast():
            encoded = encode_batch(model, images, tokens, with_tokens=True)
        loss = token_term(encoded, model.logit_scale.exp())  # a fresh scale graph per backward
        (weight * loss).backward()
        values.append(float(loss.detach()))
    return sum(values) / len(values)


def exact_batch_backward(model, batches: list[MicroBatch], objective: dict, frozen_text=None,
                         autocast: Autocast = contextlib.nullcontext,
                         shuffle_key: ShuffleKey | None = None) -> dict[str, float]:
    """Accumulate the group's gradient into .grad (zero it first) and return its loss record:
    the global term(s) over the whole group, `tok` = mean per-micro-batch L_tok, and `total`.
    `shuffle_key`: the group's (its first micro-batch's) key, for a shuffled-G objective."""
    record = _global_term_backward(model, batches, objective, frozen_text, autocast, shuffle_key)
    total = record[trained_term(objective)]
    if objective["lambda_tok"] > 0:
        record["tok"] = _token_term_backward(model, batches, objective, autocast)
        total += objective["lambda_tok"] * record["tok"]
    record["total"] = total
    record["micro_batches"] = len(batches)
    return record
