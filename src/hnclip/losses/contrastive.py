"""Global contrastive objectives, following open_clip's ClipLoss contract.

The losses take L2-normalized features and the *exponentiated* logit scale s: `infonce_loss` is the
symmetric InfoNCE of paper Eq. 1, the cross-entropy of `symmetric_cross_entropy` on the logits
`infonce_logits`. L_HN (Eq. 2: `hn_loss`, its logits `hn_logits` and the margins gamma * G_bar,
`margin_matrix`) lives beside the run's objective in `hnclip.losses.objective`, the file a run's
train.json names as the code of its loss terms.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def symmetric_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The mean of the image-to-text and text-to-image cross-entropies, the diagonal being the positives."""
    targets = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2


def infonce_logits(image_features: torch.Tensor, text_features: torch.Tensor,
                   logit_scale: torch.Tensor | float) -> torch.Tensor:
    """s * S: the scaled image-text cosine similarities."""
    return logit_scale * image_features @ text_features.t()


def infonce_loss(image_features: torch.Tensor, text_features: torch.Tensor,
                 logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE (paper Eq. 1) on the batch."""
    return symmetric_cross_entropy(infonce_logits(image_features, text_features, logit_scale))


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE, the standard fine-tuning objective (Long-CLIP FT)."""

    def forward(self, image_features, text_features, logit_scale, output_dict: bool = False, **_):
        loss = infonce_loss(image_features, text_features, logit_scale)
        return {"contrastive_loss": loss} if output_dict else loss
