"""Caption geometry (paper Table A1, Figs. 1, A5, A6): how near-duplicate a split's captions are
under a given text encoder, and their token lengths."""
from __future__ import annotations

import torch

from hnclip.config.constants import CONTEXT_LENGTH

HARDNESS_BUCKETS = (-1.0, 0.5, 0.7, 0.8, 0.9, 1.0000001)


def _off_diagonal(matrix: torch.Tensor) -> torch.Tensor:
    n = matrix.shape[0]
    return matrix[~torch.eye(n, dtype=torch.bool)]


def caption_geometry(text_features: torch.Tensor, batch_size: int = 16, example_batch: int = 8,
                     seed: int = 0, bins: int = 50) -> dict:
    """Statistics of the cosine matrix G of L2-normalized caption features [N, D]."""
    feats = torch.nn.functional.normalize(text_features.double(), dim=-1)
    n = feats.shape[0]
    if n < max(batch_size, example_batch, 2):
        raise ValueError(f"need at least {max(batch_size, example_batch, 2)} captions, got {n}")
    sims = feats @ feats.t()
    pairwise = _off_diagonal(sims)
    hardest = sims.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf")).max(dim=1).values

    # In-batch negatives of seeded random batches: what the HN margin actually sees during training.
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    in_batch = torch.cat([_off_diagonal(sims[idx][:, idx])
                          for idx in order[: n - n % batch_size].view(-1, batch_size)])
    bucket_counts = torch.histogram(in_batch.float().clamp(-1, 1), torch.tensor(HARDNESS_BUCKETS, dtype=torch.float))[0]
    example = order[:example_batch]
    g_example = sims[example][:, example].clone().fill_diagonal_(0.0)

    def histogram(values: torch.Tensor) -> dict:
        counts, edges = torch.histogram(values.float(), bins=bins, range=(-1.0, 1.0))
        return {"counts": counts.int().tolist(), "edges": [round(e, 6) for e in edges.tolist()]}

    return {
        "n_captions": n,
        "mean_pairwise_cosine": float(pairwise.mean()),
        "mean_hardest_negative_cosine": float(hardest.mean()),
        "batch_size": batch_size,
        "in_batch_share_ge_0.8": float((in_batch >= 0.8).double().mean()),
        "in_batch_share_ge_0.9": float((in_batch >= 0.9).double().mean()),
        "in_batch_buckets": {"edges": list(HARDNESS_BUCKETS[:-1]) + [1.0],
                             "shares": (bucket_counts / bucket_counts.sum()).tolist()},
        "example_batch": {"indices": example.tolist(), "G": g_example.tolist(),
                          "offdiag_mean": float(_off_diagonal(sims[example][:, example]).mean())},
        "pairwise_histogram": histogram(pairwise),
        "hardest_histogram": histogram(hardest),
    }


def token_lengths(captions: list[str]) -> list[int]:
    """Untruncated BPE length of each caption including start/end tokens."""
    from open_clip.tokenizer import SimpleTokenizer
    tokenizer = SimpleTokenizer()
    return [len(tokenizer.encode(text)) + 2 for text in captions]


def length_statistics(captions: list[str], context_length: int = CONTEXT_LENGTH) -> dict:
    lengths = token_lengths(captions)
    words = [len(text.split()) for text in captions]
    return {"mean_words": sum(words) / len(words), "min_words": min(words), "max_words": max(words),
            "mean_tokens": sum(lengths) / len(lengths), "max_tokens": max(lengths),
            "fraction_truncated": sum(length > context_length for length in lengths) / len(lengths)}
