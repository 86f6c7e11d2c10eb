"""Retrieval evaluation: encode a test split, fp32 cosine, Recall@K in both directions.

Protocol: one caption per image, the gallery is the whole test split, features are
L2-normalized and compared in fp32. Tie rule (explicit, because bf16 features and duplicated
captions do produce exact ties): with `pessimistic`, every other candidate whose score equals the
ground truth's is ranked above it; with `optimistic`, below it. The number of queries whose
ground-truth score is tied with another candidate is recorded either way.

Out of memory while encoding: the batch is halved and retried (`hnclip.runtime.out_of_memory.HalvingBatch`);
each item's features do not depend on its batch, so the numbers are the same, and the record says so
(`memory_fallback`: the size asked for, the size used, each halving).
"""
from __future__ import annotations

import contextlib
import sys

import torch

from hnclip.data.feeding import image_batches
from hnclip.models.towers import encode_image, encode_text
from hnclip.runtime.out_of_memory import HalvingBatch


@contextlib.contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _log(line: str) -> None:
    print(f"evaluation: {line}", file=sys.stderr)


def _encoded(encode, batch: torch.Tensor, device, halving: HalvingBatch | None) -> torch.Tensor:
    """encode(batch) in pieces of `halving.size` (all at once without one), fp32 on the CPU; a piece that
    runs out of memory halves the size and the batch is encoded again."""
    def attempt(size: int) -> torch.Tensor:
        return torch.cat([encode(batch[start:start + size].to(device)).float().cpu()
                          for start in range(0, len(batch), size)])
    if halving is None:
        return attempt(len(batch))
    return halving.run(attempt, device, _log)


@torch.no_grad()
def encode_images(model, dataset, batch_size: int = 256, device: str | torch.device = "cpu",
                  workers: int | None = None, halving: HalvingBatch | None = None) -> torch.Tensor:
    """Image features of a test split, fp32, L2-normalized, in manifest order. The images are decoded by
    `workers` processes (default: the dataset's `loader_workers`; 0: this one), batch by batch in order;
    `halving`: the out-of-memory fallback the batches are encoded with (see the module's docstring)."""
    with _eval_mode(model):
        return torch.cat([_encoded(lambda part: encode_image(model, part), images, device, halving)
                          for images in image_batches(dataset, batch_size, workers, device)])


@torch.no_grad()
def encode_texts(model, dataset, batch_size: int = 256, device: str | torch.device = "cpu",
                 halving: HalvingBatch | None = None) -> torch.Tensor:
    """Caption features of a test split, fp32, L2-normalized, in manifest order. Captions are encoded
    in order of length, so each batch is trimmed to captions of similar length (the causal text
    tower makes a caption's features independent of the padding it is batched with)."""
    order = torch.argsort(dataset.tokens.argmax(dim=-1), stable=True)  # by EOT position (the highest id)
    with _eval_mode(model):
        chunks = [_encoded(lambda part: encode_text(model, part), dataset.tokens[order[start:stop]], device, halving)
                  for start, stop in _spans(len(dataset), batch_size)]
    return torch.cat(chunks)[torch.argsort(order)]  # back to manifest order


def _spans(n: int, batch_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + batch_size, n)) for start in range(0, n, batch_size)]


def encode_dataset(model, dataset, batch_size: int = 256, device: str | torch.device = "cpu"):
    """Return (image_features, text_features), fp32, L2-normalized, in manifest order."""
    return encode_images(model, dataset, batch_size, device), encode_texts(model, dataset, batch_size, device)


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
    the bootstrap intervals of `hnclip.evaluation.bootstrap` resample."""
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


def evaluate_model(model, dataset, ks, tie_rule, batch_size=256, device="cpu",
                   image_features: dict | None = None) -> dict:
    """Recall@K of `model` on a test split. `image_features`, a dict shared by the calls of one set of
    weights, holds the image encodings already computed, keyed by the split's image files: a split
    that shows the same images in the same order (Long-DCI re-describes DCI's test images) reuses
    them instead of encoding them again."""
    key = tuple(row.image for row in dataset.rows)
    halving = HalvingBatch(batch_size, what="eval_batch_size")  # out of memory: halved (the record says so)
    if image_features is not None and key in image_features:
        img = image_features[key]
    else:
        img = encode_images(model, dataset, batch_size, device, halving=halving)
        if image_features is not None:
            image_features[key] = img
    result = recall_at_k(img, encode_texts(model, dataset, batch_size, device, halving), ks, tie_rule)
    if halving.record() is not None:
        result["memory_fallback"] = halving.record()
    return result
