"""Image-caption pairs from a manifest, as tensors the model takes."""
from __future__ import annotations

import math
import multiprocessing
from collections import OrderedDict
from pathlib import Path

import torch
from PIL import Image

from hnclip.data.image_cache import CachedPixels, PixelTransform
from hnclip.data.manifest import ManifestRow, read_manifest

# The decoded-image cache of one dataset in one process (`execution.image_cache_mb`). 1 GiB holds every
# image of the embedded default's largest dataset (the backbone's pretraining corpus: 3,000 images of
# 3 x 64 x 64 fp32, 48 KiB each = 141 MiB; a fine-tuning job's train and test sets hold 512 and 300), so
# that profile caches everything exactly as the unbounded cache did. At 224 px an image is 588 KiB: 1 GiB
# holds ~1,800 of them, where DOCCI's 9,647 training images would need 5.5 GiB in every process that
# decodes them (the main process and each loader worker).
# (`execution.image_cache`, `hnclip.data.image_cache`, decodes each split once for every job instead.)
DEFAULT_IMAGE_CACHE_MB = 1024


def loading_options(execution: dict) -> dict:
    """PairDataset.from_manifest's keyword arguments from a profile's `execution` settings."""
    return {"cache_mb": execution.get("image_cache_mb", DEFAULT_IMAGE_CACHE_MB),
            "loader_workers": execution.get("loader_workers", 0),
            "image_cache": execution.get("image_cache", False)}


class ImageCache:
    """Least-recently-used tensors, bounded in bytes. A tensor larger than the whole budget is not kept."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[int, torch.Tensor] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: int) -> torch.Tensor | None:
        tensor = self._items.get(key)
        if tensor is not None:
            self._items.move_to_end(key)
        return tensor

    def put(self, key: int, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if key in self._items or size > self.max_bytes:
            return
        self._items[key] = tensor
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= evicted.numel() * evicted.element_size()


class PairDataset(torch.utils.data.Dataset):
    """Rows of one manifest split; captions tokenized up front, images decoded on demand and kept in a
    bounded LRU cache (`cache_mb` per process: a loader worker holds its own, filled by what it decodes).
    `loader_workers`: the worker processes that decode this split's images for evaluation
    (`hnclip.data.feeding.image_batches`; 0: the calling process).

    With `pixels` (the split's image cache, `hnclip.data.image_cache`) nothing is decoded: `image` and
    `batch` normalize the cached pixels on the CPU, and `pixel_batch` hands them over as uint8 for
    `normalize` on the device. `decodes` counts the images decoded, by this process and the loader workers
    forked from it (a counter in shared memory)."""

    def __init__(self, rows: list[ManifestRow], preprocess, tokenizer, cache_images: bool = True,
                 cache_mb: float = DEFAULT_IMAGE_CACHE_MB, loader_workers: int = 0,
                 pixels: CachedPixels | None = None):
        self.rows = rows
        self.preprocess = preprocess
        self.tokens = tokenizer([row.caption for row in rows])
        self.cache_images = cache_images
        self.loader_workers = loader_workers
        self.pixels = pixels
        self._decodes = multiprocessing.Value("q", 0)
        self._cache = ImageCache(int(cache_mb * 2**20) if cache_images and pixels is None else 0)

    @classmethod
    def from_manifest(cls, path: str | Path, preprocess, tokenizer, cache_images: bool = True,
                      cache_mb: float = DEFAULT_IMAGE_CACHE_MB, loader_workers: int = 0, image_cache: bool = False):
        """`image_cache`: read the split's image cache (which must match the manifest and `preprocess`)."""
        rows = read_manifest(path)
        pixels = CachedPixels(path, [row.id for row in rows], PixelTransform.from_preprocess(preprocess)) \
            if image_cache else None
        return cls(rows, preprocess, tokenizer, cache_images, cache_mb, loader_workers, pixels)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def decodes(self) -> int:
        return self._decodes.value

    def cached(self, index: int) -> bool:
        return self.pixels is not None or index in self._cache

    def keep(self, index: int, tensor: torch.Tensor) -> None:
        """Cache an image decoded elsewhere (by a loader worker) in this process."""
        self._cache.put(index, tensor)

    def image(self, index: int) -> torch.Tensor:
        if self.pixels is not None:
            return self.normalize(self.pixels.take([index]))[0]
        cached = self._cache.get(index)
        if cached is not None:
            return cached
        with Image.open(self.rows[index].image) as img:
            tensor = self.preprocess(img.convert("RGB"))
        with self._decodes.get_lock():
            self._decodes.value += 1
        self._cache.put(index, tensor)
        return tensor

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels of the image cache -> the model's input, where they are (`pixels` is set)."""
        return self.pixels.transform.normalize(pixels)

    def pixel_batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        """(uint8 images, tokens) of `indices` from the image cache: `normalize` the images on the device."""
        return self.pixels.take(indices), self.tokens[torch.as_tensor(list(indices))]

    def __getitem__(self, index: int):
        return self.image(index), self.tokens[index]

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pixels is not None:
            images, tokens = self.pixel_batch(indices)
            return self.normalize(images), tokens
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
