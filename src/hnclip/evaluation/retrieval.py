"""Retrieval evaluation: encode a test split, fp32 cosine, Recall@K in both directions.

Protocol: one caption per image, the gallery is the whole test split, features are
L2-normalized and compared in fp32. Tie rule (explicit, because bf16 features and duplicated
captions do produce exact ties): with `pessimistic`, every other candidate whose score equals the
ground truth's is ranked above it; with `optimistic`, below it. The number of queries whose
ground-truth score is tied with another candidate is recorded either way.
"""
from __future__ import annotations

import torch

from hnclip.models.towers import encode_image, encode_text


@torch.no_grad()
def encode_dataset(model, dataset, batch_size: int = 256, device: str | torch.device = "cpu"):
    """Return (image_features, text_features), fp32, L2-normalized, in manifest order."""
    was_training = model.training
    model.eval()
    images, texts = [], []
    for start in range(0, len(dataset), batch_size):
        idx = range(start, min(start + batch_size, len(dataset)))
        img, tok = dataset.batch(idx)
        images.append(encode_image(model, img.to(device)).float().cpu())
        texts.append(encode_text(model, tok.to(device)).float().cpu())
    model.train(was_training)
    return torch.cat(images), torch.cat(texts)


def ranks_of_positives(scores: torch.Tensor, tie_rule: str = "pessimistic") -> tuple[torch.Tensor, torch.Tensor]:
    """scores[q, c]: query q against candidate c, ground truth on the diagonal.
    Returns (0-based rank of each query's ground truth, whether that query had a tie)."""
    if tie_rule not in ("pessimistic", "optimistic"):
        raise ValueError(f"tie_rule must be 'pessimistic' or 'optimistic', got {tie_rule!r}")
    positive = scores.diagonal().unsqueeze(1)
    higher = (scores > positive).sum(dim=1)
    tied = (scores == positive).sum(dim=1) - 1  # the ground truth equals itself
    ranks = higher + tied if tie_rule == "pessimistic" else higher
    return ranks, tied > 0


def recall_at_k(image_features: torch.Tensor, text_features: torch.Tensor, ks=(1, 5, 10),
                tie_rule: str = "pessimistic") -> dict:
    """Recall@K (percent) for text->image and image->text retrieval of paired features, with the
    0-based rank of every query's ground truth (`ranks`, in manifest order): the per-query outcomes
    the bootstrap intervals of `hnclip.report.uncertainty` resample."""
    if image_features.shape != text_features.shape:
        raise ValueError("one caption per image is required: feature shapes differ "
                         f"({tuple(image_features.shape)} vs {tuple(text_features.shape)})")
    sims = image_features.float() @ text_features.float().t()  # [image, text]
    result = {"n": int(sims.shape[0]), "tie_rule": tie_rule, "ties": {}, "ranks": {}}
    # A contiguous copy for t2i: row-wise comparisons over a transposed view are strided and slow.
    for direction, scores in (("t2i", sims.t().contiguous()), ("i2t", sims)):
        ranks, tied = ranks_of_positives(scores, tie_rule)
        result[direction] = {f"R@{k}": float((ranks < k).float().mean() * 100) for k in ks}
        result["ties"][direction] = int(tied.sum())
        result["ranks"][direction] = ranks.tolist()  # python ints
    return result


def evaluate_model(model, dataset, ks, tie_rule, batch_size=256, device="cpu") -> dict:
    img, txt = encode_dataset(model, dataset, batch_size, device)
    return recall_at_k(img, txt, ks, tie_rule)
