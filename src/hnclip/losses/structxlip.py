"""StructXLIP's training objective on an open_clip CLIP (spec: shared/research/baselines.md §2.2).

    L = L_g + w_SC(e) L_SC + w_RS(e) L_RS + w_LSC(e) L_LSC

from one forward of the images [I; E; E_crops] (photo, global edge map, top-K edge-map crops) and
the texts [Tx; Tx_f] (caption, colour-filtered caption):
  * L_g   global image-caption loss: InfoNCE, or L_HN when the objective's gamma > 0;
  * L_SC  CLIP loss between edge maps and filtered captions, logit scale detached;
  * L_RS  mean(1 - cos(v, v_E)) between a photo and its edge map;
  * L_LSC each structure chunk of the caption (a word window, `data.auxiliary.caption_filter`)
          against the edge crops: positives are its own image's valid crops, negatives all other
          valid crops of the batch.
L_SC and L_RS use the samples that have an edge map. `n(x) = (x + 1e-8) / |x + 1e-8|` as released.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch
import torch.nn.functional as F

from ..models.towers import text_length
from .contrastive import infonce_loss
from .objective import (
    Autocast,
    as_float32,
    contrastive_terms,
    frozen_g_features,
    trained_term,
)

EPS = 1e-8               # released normalisation offset
CHUNK_TAU = 0.07         # L_LSC temperature: sigma = min(e^s / tau, MAX_CHUNK_SCALE)
MAX_CHUNK_SCALE = 100.0
MAX_LOG_SCALE = 3.5      # s is clamped to [0, 3.5] after every optimizer step
AUX_TERMS = ("sc", "rs", "lsc")
CHUNK_TOKEN_SOURCES = ("unfiltered", "filtered")
# finetune.sh: base weights, cosine floors, decay length; released quirk: chunks index Tx, not Tx_f.
DEFAULT_SETTINGS = {"weights": (0.25, 0.001, 0.001), "floors": (0.7, 0.5, 0.4), "decay_epochs": 7,
                    "chunk_tokens": "unfiltered"}


@dataclasses.dataclass
class StructXBatch:
    """One StructXLIP micro-batch of B samples with K edge crops each."""
    images: torch.Tensor            # [B, 3, S, S]
    tokens: torch.Tensor            # [B, T] original captions
    filtered_tokens: torch.Tensor   # [B, T] filtered captions
    edge_images: torch.Tensor       # [B, 3, S, S] global edge maps (any image where missing)
    has_edge: torch.Tensor          # [B] bool
    edge_crops: torch.Tensor        # [B, K, 3, S, S]
    crop_valid: torch.Tensor        # [B, K] bool
    chunk_spans: list[list[tuple[int, int]]]  # per sample: token spans [start, end), BOS at 0

    def to(self, device) -> StructXBatch:
        tensors = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                   if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **tensors)


def structxlip_weights(epoch: int, base: tuple[float, float, float] = DEFAULT_SETTINGS["weights"],
                       floors: tuple[float, float, float] = DEFAULT_SETTINGS["floors"],
                       decay_epochs: int = DEFAULT_SETTINGS["decay_epochs"]) -> dict[str, float]:
    """Weights of sc/rs/lsc at 0-based `epoch`: base * factor, factor 1 up to epoch 1, then a cosine
    from 1 down to the floor reached at epoch 1 + decay_epochs."""
    progress = min(max(epoch - 1, 0), decay_epochs) / decay_epochs
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return {name: w * (floor + (1.0 - floor) * cosine) for name, w, floor in zip(AUX_TERMS, base, floors)}


def clamp_logit_scale_(model, max_log: float = MAX_LOG_SCALE) -> None:
    """Clamp the log-space logit scale s to [0, max_log] in place (call after every optimizer step)."""
    with torch.no_grad():
        model.logit_scale.clamp_(0.0, max_log)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x + EPS, dim=-1)


def encode_text_states(model, tokens: torch.Tensor, min_length: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Projected EOT features [B, D] (not normalized) and the final-LN hidden states [B, L, width].

    Trailing padding is trimmed by `models.towers.text_length`, the rule of `towers.encode_text` (the
    causal mask keeps earlier positions exact), but never below `min_length`, so every chunk span
    stays inside the states.
    """
    length = max(text_length(tokens), min_length)
    tokens = tokens[:, :length]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype) + model.positional_embedding[:length].to(cast_dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    hidden = model.ln_final(x)
    pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), tokens.argmax(dim=-1)]
    return pooled @ model.text_projection, hidden


def pool_chunks(hidden: torch.Tensor, spans: list[list[tuple[int, int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk vectors sum_j alpha_j H_j over each span, alpha = softmax of the token norms (no grad).

    Returns pooled [B, C, width] (C = most chunks of a sample; missing chunks are zero) and a
    [B, C] mask of the real chunks.
    """
    batch, length, _ = hidden.shape
    n_chunks = max((len(sample) for sample in spans), default=0)
    member = torch.zeros(batch, n_chunks, length, dtype=torch.bool)
    for b, sample in enumerate(spans):
        for c, (start, end) in enumerate(sample):
            member[b, c, start:end] = True
    member = member.to(hidden.device)
    with torch.no_grad():
        norms = hidden.float().norm(dim=-1)[:, None, :].expand(batch, n_chunks, length)
        # Rows of padding chunks are all -inf: their NaN softmax becomes zero weights.
        alpha = torch.softmax(norms.masked_fill(~member, -math.inf), dim=-1).nan_to_num(0.0)
    pooled = torch.einsum("bcl,blw->bcw", alpha.to(hidden.dtype), hidden)
    return pooled, member.any(dim=-1)


def local_structure_loss(chunk_features: torch.Tensor, chunk_mask: torch.Tensor, crop_features: torch.Tensor,
                         crop_valid: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """L_LSC from unit chunk features [B, C, D] and unit crop features [B, K, D].

    Per chunk of sample b: logsumexp over all valid crops minus logsumexp over b's valid crops, of
    scale * cosine; mean over chunks, then over the samples with >= 1 chunk and >= 1 valid crop
    (zero when there is none).
    """
    batch, n_crops, dim = crop_features.shape
    valid = crop_valid.reshape(-1)
    logits = scale * chunk_features @ crop_features.reshape(batch * n_crops, dim).t()   # [B, C, B*K]
    lowest = torch.finfo(logits.dtype).min
    own = torch.eye(batch, dtype=torch.bool, device=valid.device).repeat_interleave(n_crops, dim=1) & valid
    log_all = torch.logsumexp(logits.masked_fill(~valid, lowest), dim=-1)
    log_own = torch.logsumexp(logits.masked_fill(~own[:, None, :], lowest), dim=-1)
    used = chunk_mask & crop_valid.any(dim=1, keepdim=True)
    samples = used.any(dim=1)
    if not samples.any():
        return logits.new_zeros(())
    per_chunk = torch.where(used, log_all - log_own, torch.zeros_like(log_all))
    per_sample = per_chunk.sum(dim=1) / used.sum(dim=1).clamp(min=1)
    return per_sample[samples].mean()


def structxlip_loss_terms(model, batch: StructXBatch, objective: dict, settings: dict, epoch: int,
                          autocast: Autocast = contextlib.nullcontext, frozen_text=None) -> dict[str, torch.Tensor]:
    """The named terms of one micro-batch: `g` (the trained global term) with the diagnostics of
    `contrastive_terms` (`infonce`, `hn`), `sc`, `rs`, `lsc`, and `total`, the one back-propagated.

    `settings`: `weights`, `floors`, `decay_epochs` (see `structxlip_weights`) and `chunk_tokens`,
    the token sequence the chunk spans index: "unfiltered" (released) or "filtered". The forward runs
    under `autocast`; the chunk pooling, LN and projection and all losses in fp32, as released.
    """
    if settings["chunk_tokens"] not in CHUNK_TOKEN_SOURCES:
        raise ValueError(f"chunk_tokens must be one of {CHUNK_TOKEN_SOURCES}, got {settings['chunk_tokens']!r}")
    n = batch.images.shape[0]
    n_crops = batch.crop_valid.shape[1]
    span_end = max((end for sample in batch.chunk_spans for _, end in sample), default=0)
    with autocast():
        images = torch.cat([batch.images, batch.edge_images, batch.edge_crops.flatten(0, 1)])
        image_out = model.visual(images)
        text_out, hidden = encode_text_states(model, torch.cat([batch.tokens, batch.filtered_tokens]), span_end)
        g_features = frozen_g_features(frozen_text, batch.tokens, objective)
    # Released: the chunks are pooled and go through the final LN (again) and the projection in
    # compute_local_structure_centric_loss (losses.py:171-187), outside Fabric's autocast: in fp32.
    chunk_hidden = hidden[:n] if settings["chunk_tokens"] == "unfiltered" else hidden[n:]
    pooled, chunk_mask = pool_chunks(as_float32(chunk_hidden), batch.chunk_spans)
    chunk_out = model.ln_final(pooled) @ model.text_projection
    v, v_edge, v_crops = as_float32(image_out).split([n, n, n * n_crops])
    t, t_filtered = as_float32(text_out).split([n, n])
    scale = model.logit_scale.exp()

    terms = contrastive_terms(F.normalize(v, dim=-1), F.normalize(t, dim=-1), scale, objective, g_features)
    terms["g"] = terms[trained_term(objective)]
    has = batch.has_edge
    if has.any():
        terms["sc"] = infonce_loss(_unit(v_edge[has]), _unit(t_filtered[has]), scale.detach())
        terms["rs"] = (1.0 - (_unit(v[has]) * _unit(v_edge[has])).sum(dim=-1)).mean()
    else:
        terms["sc"] = terms["rs"] = v.new_zeros(())
    sigma = (scale / CHUNK_TAU).clamp(max=MAX_CHUNK_SCALE)
    terms["lsc"] = local_structure_loss(_unit(as_float32(chunk_out)), chunk_mask,
                                        _unit(v_crops).view(n, n_crops, -1), batch.crop_valid, sigma)
    weights = structxlip_weights(epoch, settings["weights"], settings["floors"], settings["decay_epochs"])
    terms["total"] = terms["g"] + sum(weights[name] * terms[name] for name in AUX_TERMS)
    return terms
