"""Global contrastive objectives, following open_clip's ClipLoss contract.

`forward(image_features, text_features, logit_scale, ..., output_dict=False)` takes L2-normalized
features and the *exponentiated* logit scale s, and returns the scalar loss or a dict of named
terms that the trainer sums.

Margin controls (beyond the paper, Table X1): `constant` gives every negative the same margin,
gamma * mean(G_bar off-diagonal) of its batch (an AM-softmax-style fixed margin); `shuffled` permutes
the caption pairs' margins within the batch (the same margins, no longer on the pairs whose captions
are similar). Both keep the diagonal at 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _symmetric_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    targets = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2


MARGIN_CONTROLS = ("none", "constant", "shuffled")


def margin_matrix(margin_text_features: torch.Tensor, gamma: float, control: str = "none",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """gamma * G_bar: detached text-text cosine with a zero diagonal (paper Eq. 2), or one of its
    controls (`constant_margins`, `shuffled_margins`; `generator` draws the shuffle)."""
    # At least fp32 (bf16 features under autocast), never lower than the input's precision.
    feats = margin_text_features.detach()
    feats = F.normalize(feats.to(torch.promote_types(feats.dtype, torch.float32)), dim=-1)
    boost = gamma * (feats @ feats.t())
    boost.fill_diagonal_(0.0)
    if control == "none":
        return boost
    if control == "constant":
        return constant_margins(boost)
    if control == "shuffled":
        if generator is None:
            raise ValueError("shuffled margins need a generator (the run seed and the micro-batch's position)")
        return shuffled_margins(boost, generator)
    raise ValueError(f"unknown margin control {control!r}; allowed values: {MARGIN_CONTROLS}")


def constant_margins(boost: torch.Tensor) -> torch.Tensor:
    """Every off-diagonal entry replaced by the mean of the off-diagonal entries; the diagonal 0."""
    n = boost.shape[0]
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=boost.device)
    mean = boost[off_diagonal].mean() if n > 1 else boost.new_zeros(())
    return torch.where(off_diagonal, mean, torch.zeros_like(boost))


def shuffled_margins(boost: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The caption pairs' margins permuted among the pairs: the upper triangle's values are shuffled
    (a permutation drawn from the CPU `generator`) and mirrored, so the result stays symmetric like
    G, keeps the multiset of off-diagonal values and a zero diagonal, and no longer ties a margin to
    the pair whose captions are similar."""
    n = boost.shape[0]
    rows, cols = torch.triu_indices(n, n, offset=1, device=boost.device)
    values = boost[rows, cols]
    order = torch.randperm(values.numel(), generator=generator).to(boost.device)
    shuffled = torch.zeros_like(boost)
    shuffled[rows, cols] = values[order]
    shuffled[cols, rows] = values[order]
    return shuffled


def infonce_loss(image_features: torch.Tensor, text_features: torch.Tensor,
                 logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE (paper Eq. 1) on the batch."""
    return _symmetric_cross_entropy(logit_scale * image_features @ text_features.t())


def hn_loss(image_features: torch.Tensor, text_features: torch.Tensor,
            logit_scale: torch.Tensor | float, gamma: float,
            margin_text_features: torch.Tensor | None = None, control: str = "none",
            generator: torch.Generator | None = None) -> torch.Tensor:
    """L_HN (paper Eq. 2): InfoNCE on logits s * (S + gamma * G_bar) (or a margin control of G_bar)."""
    margin_source = text_features if margin_text_features is None else margin_text_features
    sims = image_features @ text_features.t()
    boost = margin_matrix(margin_source, gamma, control, generator).to(sims.dtype)
    return _symmetric_cross_entropy(logit_scale * (sims + boost))


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE, the standard fine-tuning objective (Long-CLIP FT)."""

    def forward(self, image_features, text_features, logit_scale, output_dict: bool = False, **_):
        loss = infonce_loss(image_features, text_features, logit_scale)
        return {"contrastive_loss": loss} if output_dict else loss


class HNClipLoss(nn.Module):
    """Text-similarity-boosted InfoNCE: the positive must beat each negative j by gamma * G_ij.

    G is the cosine matrix of `margin_text_features` (by default the live `text_features`,
    i.e. recomputed from the current encoder every step), detached and with its diagonal zeroed.
    gamma = 0 is exactly InfoNCE.
    """

    def __init__(self, gamma: float = 0.5):
        super().__init__()
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = float(gamma)

    def forward(self, image_features, text_features, logit_scale, margin_text_features=None,
                output_dict: bool = False):
        loss = hn_loss(image_features, text_features, logit_scale, self.gamma, margin_text_features)
        return {"contrastive_loss": loss} if output_dict else loss
