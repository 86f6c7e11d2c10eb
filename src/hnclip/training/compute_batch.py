"""`recipe.compute_batch`: encode several micro-batches of an accumulation group in one forward.

The contrastive group stays the micro-batch (the paper's 16-way softmax); only the forward gets
larger. Up to `compute_batch` pairs (a multiple of `micro_batch`) are concatenated and encoded
at once; every in-batch term is then computed per micro-batch on its rows of the features
(block-diagonal: the group's own logits, its own live or frozen G, its own token term: the token
terms of all groups of a forward in one block-diagonal call, `objective.grouped_token_terms`), and
sum(group totals) / len(group batches) is back-propagated. The towers have no batch-dependent
layers (LayerNorm, no BatchNorm) and train without dropout, so this is the gradient of sequential
accumulation up to float rounding, while an accelerator runs one large batch instead of several
small ones. (With dropout > 0, e.g. LoRA dropout, the masks are drawn differently: equal in
distribution only.)

Captions are trimmed to the longest caption of the whole forward (`towers.trim_padding`), so a
group's text tokens can carry more padding than a forward of that group alone; the token term
masks padded positions out, so its value does not depend on it.

In a multi-process run each rank concatenates its shares of the micro-batches, and each group's
terms gather that group's features from all ranks (`hnclip.losses.distributed`): every rank
computes the groups in the same order, so the collectives match.

Memory: all groups' loss graphs are kept until the one backward; the token term keeps only its argmax
indices, but its one call per forward makes the cosines of every group's chunk at once, (compute_batch /
micro_batch) x [m, chunk, P, T] fp32 while it runs (about 0.5 GB at the paper's 8 x 16 pairs, chunks
of 16, 256 patches, 248 tokens); the encoder activations of the large forward dominate.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import torch

from hnclip.losses.objective import Autocast, ShuffleKey, frozen_g_features, group_terms, grouped_token_similarities
from hnclip.models.towers import Encoded, encode_batch
from hnclip.training.memory import micro_batches_per_forward

MicroBatch = tuple[torch.Tensor, torch.Tensor]  # (images, tokens), on the device
# (encoded rows of one group, exponentiated logit scale, objective, frozen-G features or None) -> named terms;
# given shuffle keys, the group's key comes as a fifth argument (`group_terms` takes it)
GroupTerms = Callable[..., dict[str, torch.Tensor]]


def encoded_rows(encoded: Encoded, rows: slice) -> Encoded:
    """The same rows of every feature of `encoded` (absent features stay None)."""
    return Encoded(**{f.name: None if getattr(encoded, f.name) is None else getattr(encoded, f.name)[rows]
                      for f in fields(Encoded)})


def compute_batch_backward(model, batches: list[MicroBatch], objective: dict, frozen_text, autocast: Autocast,
                           check: Callable[[dict], None], compute_batch: int, micro_batch: int,
                           terms: GroupTerms = group_terms, shuffle_keys: list[ShuffleKey] | None = None,
                           before_forward: Callable[[int], None] = lambda pairs: None) -> list[dict]:
    """Accumulate one accumulation group's gradient into .grad, encoding `compute_batch` pairs per
    forward; returns one record of float loss terms per micro-batch, in order. `check(record)` sees
    every record of a forward before its backward. `terms` computes one group's terms (frameworks
    with their own in-batch losses pass theirs). `shuffle_keys`: each micro-batch's shuffle key (a
    shuffled-G objective needs them). `before_forward(pairs)` sees each forward's size first."""
    per_forward = micro_batches_per_forward(compute_batch, micro_batch)
    keys = list(shuffle_keys) if shuffle_keys is not None else [None] * len(batches)
    if len(keys) != len(batches):
        raise ValueError(f"{len(keys)} shuffle keys for {len(batches)} micro-batches")
    records = []
    for start in range(0, len(batches), per_forward):
        chunk = batches[start:start + per_forward]
        before_forward(sum(images.shape[0] for images, _ in chunk))
        records += _forward_backward(model, chunk, len(batches), objective, frozen_text, autocast, check, terms,
                                     keys[start:start + per_forward])
    return records


def _forward_backward(model, chunk: list[MicroBatch], group_size: int, objective: dict, frozen_text,
                      autocast: Autocast, check: Callable[[dict], None], terms: GroupTerms,
                      shuffle_keys: list[ShuffleKey | None]) -> list[dict]:
    tokens = torch.cat([t for _, t in chunk])
    with autocast():
        encoded = encode_batch(model, torch.cat([i for i, _ in chunk]), tokens, with_tokens=objective["lambda_tok"] > 0)
        g_features = frozen_g_features(frozen_text, tokens, objective)
    scale = model.logit_scale.exp()
    token_scores = _merged_token_scores(encoded, chunk, objective, terms)
    group_losses, start = [], 0
    for index, ((images, _), key) in enumerate(zip(chunk, shuffle_keys, strict=True)):
        rows = slice(start, start + images.shape[0])
        start = rows.stop
        margin = None if g_features is None else g_features[rows]
        keyed = () if key is None else (key,)
        merged = {} if token_scores is None else {"token_similarities": (token_scores[0][index],
                                                                          token_scores[1][index])}
        group_losses.append(terms(encoded_rows(encoded, rows), scale, objective, margin, *keyed, **merged))
    records = _as_floats(group_losses)
    for record in records:
        check(record)
    (torch.stack([losses["total"] for losses in group_losses]).sum() / group_size).backward()
    return records


def _merged_token_scores(encoded: Encoded, chunk: list[MicroBatch], objective: dict,
                         terms: GroupTerms) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every group's FILIP scores of one forward in one call (`grouped_token_similarities`: the same
    block-diagonal per-group scores, with one group's kernel launches instead of one per group), where the
    terms are the objective's own (`group_terms`) and the groups are equal; None: each group scores its own.
    Each group's cross-entropy stays in its own `group_terms` call, so the logit scale's gradient sums its
    contributions in the same order as before."""
    sizes = {images.shape[0] for images, _ in chunk}
    if terms is not group_terms or objective["lambda_tok"] <= 0 or len(chunk) < 2 or len(sizes) > 1:
        return None
    return grouped_token_similarities(encoded, len(chunk))


def _as_floats(group_losses: list[dict[str, torch.Tensor]]) -> list[dict[str, float]]:
    # One device-to-host copy for all values, rather than a synchronisation per term.
    flat = torch.stack([value.detach().float() for losses in group_losses for value in losses.values()]).tolist()
    records, position = [], 0
    for losses in group_losses:
        records.append(dict(zip(losses, flat[position:position + len(losses)])))
        position += len(losses)
    return records
