"""Global contrastive objectives, following open_clip's ClipLoss contract.

The losses take L2-normalized features and the *exponentiated* logit scale s: `infonce_loss` is the
symmetric InfoNCE of paper Eq. 1, `hn_loss` is L_HN of Eq. 2. Each is the symmetric cross-entropy of its
logits (`infonce_logits`, `hn_logits`), which the gradient probe differentiates through. A run's objective
(params.yaml's keys, `hnclip.config.objective_keys`) is turned into these calls in one place,
`hnclip.losses.objective.global_logits`, for the trainer and the probe alike.

Names (the glossary of docs/pipeline.md): the *G features* are the text features G is the cosine matrix
of (the live text features, or those of a frozen initial text tower: the *G source*); a *margin* is the
gap a positive's logit must clear over a negative's, and `margin_matrix` gives the margins gamma * G_bar
or a *margin control* of them (beyond the paper, Table X1): `constant` gives every negative the same margin,
gamma * mean(G_bar off-diagonal) of its batch (an AM-softmax-style fixed margin); `shuffled` permutes
the caption pairs' margins within the batch (the same margins, no longer on the pairs whose captions
are similar). Both keep the diagonal at 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hnclip.config.objective_keys import MARGIN_CONTROLS


def symmetric_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """The mean of the image-to-text and text-to-image cross-entropies, the diagonal being the positives."""
    targets = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2


def margin_matrix(g_features: torch.Tensor, gamma: float, margin_control: str = "none",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """gamma * G_bar: detached text-text cosine with a zero diagonal (paper Eq. 2), or one of its
    controls (`constant_margins`, `shuffled_margins`; `generator` draws the shuffle)."""
    # At least fp32 (bf16 features under autocast), never lower than the input's precision.
    feats = g_features.detach()
    feats = F.normalize(feats.to(torch.promote_types(feats.dtype, torch.float32)), dim=-1)
    margins = gamma * (feats @ feats.t())
    margins.fill_diagonal_(0.0)
    if margin_control == "none":
        return margins
    if margin_control == "constant":
        return constant_margins(margins)
    if margin_control == "shuffled":
        if generator is None:
            raise ValueError("shuffled margins need a generator (the run seed and the micro-batch's position)")
        return shuffled_margins(margins, generator)
    raise ValueError(f"unknown margin control {margin_control!r}; allowed values: {list(MARGIN_CONTROLS)}")


def constant_margins(margins: torch.Tensor) -> torch.Tensor:
    """Every off-diagonal entry replaced by the mean of the off-diagonal entries; the diagonal 0."""
    n = margins.shape[0]
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=margins.device)
    mean = margins[off_diagonal].mean() if n > 1 else margins.new_zeros(())
    return torch.where(off_diagonal, mean, torch.zeros_like(margins))


def shuffled_margins(margins: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The caption pairs' margins permuted among the pairs: the upper triangle's values are shuffled
    (a permutation drawn from the CPU `generator`) and mirrored, so the result stays symmetric like
    G, keeps the multiset of off-diagonal values and a zero diagonal, and no longer ties a margin to
    the pair whose captions are similar."""
    n = margins.shape[0]
    rows, cols = torch.triu_indices(n, n, offset=1, device=margins.device)
    values = margins[rows, cols]
    order = torch.randperm(values.numel(), generator=generator).to(margins.device)
    shuffled = torch.zeros_like(margins)
    shuffled[rows, cols] = values[order]
    shuffled[cols, rows] = values[order]
    return shuffled


def infonce_logits(image_features: torch.Tensor, text_features: torch.Tensor,
                   logit_scale: torch.Tensor | float) -> torch.Tensor:
    """s * S: the scaled image-text cosine similarities."""
    return logit_scale * image_features @ text_features.t()


def hn_logits(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor | float,
              gamma: float, g_features: torch.Tensor | None = None, margin_control: str = "none",
              generator: torch.Generator | None = None, **margin_settings) -> torch.Tensor:
    """s * (S + gamma * G_bar) (or a margin control of G_bar); G is that of the `text_features` themselves
    (the live encoder's) unless other `g_features` are given (e.g. a frozen initial text tower's). The
    objective's other margin settings (`margin_settings`, by their keys' names in
    hnclip.config.objective_keys) go to `margin_matrix` as they are."""
    sims = image_features @ text_features.t()
    margins = margin_matrix(text_features if g_features is None else g_features, gamma,
                            margin_control, generator, **margin_settings)
    return logit_scale * (sims + margins.to(sims.dtype))


def infonce_loss(image_features: torch.Tensor, text_features: torch.Tensor,
                 logit_scale: torch.Tensor | float) -> torch.Tensor:
    """Symmetric InfoNCE (paper Eq. 1) on the batch."""
    return symmetric_cross_entropy(infonce_logits(image_features, text_features, logit_scale))


def hn_loss(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor | float,
            gamma: float, g_features: torch.Tensor | None = None, margin_control: str = "none",
            generator: torch.Generator | None = None) -> torch.Tensor:
    """L_HN (paper Eq. 2): InfoNCE on the logits s * (S + gamma * G_bar) (`hn_logits`); the positive must
    beat each negative j by gamma * G_ij. gamma = 0 is exactly InfoNCE."""
    return symmetric_cross_entropy(hn_logits(image_features, text_features, logit_scale, gamma, g_features,
                                             margin_control, generator))


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE, the standard fine-tuning objective (Long-CLIP FT)."""

    def forward(self, image_features, text_features, logit_scale, output_dict: bool = False, **_):
        loss = infonce_loss(image_features, text_features, logit_scale)
        return {"contrastive_loss": loss} if output_dict else loss
