"""Image-caption pairs from a manifest, as tensors the model takes."""
from __future__ import annotations

import math
from pathlib import Path

import torch
from PIL import Image

from hnclip.data.manifest import ManifestRow, read_manifest


class PairDataset(torch.utils.data.Dataset):
    """Rows of one manifest split; captions tokenized up front, images decoded on demand (cached)."""

    def __init__(self, rows: list[ManifestRow], preprocess, tokenizer, cache_images: bool = True):
        self.rows = rows
        self.preprocess = preprocess
        self.tokens = tokenizer([row.caption for row in rows])
        self.cache_images = cache_images
        self._cache: dict[int, torch.Tensor] = {}

    @classmethod
    def from_manifest(cls, path: str | Path, preprocess, tokenizer, cache_images: bool = True):
        return cls(read_manifest(path), preprocess, tokenizer, cache_images)

    def __len__(self) -> int:
        return len(self.rows)

    def image(self, index: int) -> torch.Tensor:
        if index in self._cache:
            return self._cache[index]
        with Image.open(self.rows[index].image) as img:
            tensor = self.preprocess(img.convert("RGB"))
        if self.cache_images:
            self._cache[index] = tensor
        return tensor

    def __getitem__(self, index: int):
        return self.image(index), self.tokens[index]

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.stack([self.image(i) for i in indices])
        return images, self.tokens[torch.as_tensor(list(indices))]


def subset_indices(n: int, fraction: float, subset_seed: int = 0) -> list[int]:
    """The first ceil(fraction*n) items of one fixed permutation: nested across fractions and
    identical for every method and run seed (the data-fraction study compares like with like)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(subset_seed)).tolist()
    keep = max(1, math.ceil(fraction * n - 1e-9))
    return sorted(order[:keep])
