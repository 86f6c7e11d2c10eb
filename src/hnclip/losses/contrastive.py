"""Global contrastive objectives, following open_clip's ClipLoss contract.

`forward(image_features, text_features, logit_scale, ..., output_dict=False)` takes L2-normalized
features and the *exponentiated* logit scale s, and returns the scalar loss or a dict of named
terms that the trainer sums.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _symmetric_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    targets = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2


def margin_matrix(margin_text_features: torch.Tensor, gamma: float) -> torch.Tensor:
    """gamma * G_bar: detached text-text cosine with a zero diagonal (paper Eq. 2)."""
    # At least fp32 (bf16 features under autocast), never lower than the input's precision.
    feats = margin_text_features.detach()
    feats = F.normalize(feats.to(torch.promote_types(feats.dtype, torch.float32)), dim=-1)
    boost = gamma * (feats @ feats.t())
    return boost.fill_diagonal_(0.0)


def infonce_loss(image_features: torch.Tensor, text_features: torch.Tensor,
                 logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE (paper Eq. 1) on the batch."""
    return _symmetric_cross_entropy(logit_scale * image_features @ text_features.t())


def hn_loss(image_features: torch.Tensor, text_features: torch.Tensor,
            logit_scale: torch.Tensor | float, gamma: float,
            margin_text_features: torch.Tensor | None = None) -> torch.Tensor:
    """L_HN (paper Eq. 2): InfoNCE on logits s * (S + gamma * G_bar)."""
    margin_source = text_features if margin_text_features is None else margin_text_features
    sims = image_features @ text_features.t()
    boost = margin_matrix(margin_source, gamma).to(sims.dtype)
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
