"""A dataset split's images decoded once: uint8 pixels at the model's input size, memory-mapped by every
job that reads the split (`execution.image_cache`; built by `hnclip image-cache`, `hnclip.commands.image_cache`).

open_clip's eval transform is PIL steps (resize, centre crop, RGB) whose output is a uint8 image,
then ToTensor (x / 255 in fp32) and Normalize ((x - mean) / std). The cache stores the uint8 image;
the two fp32 steps are applied where the pixels are used, on the device after a uint8 copy (4x less
to copy than fp32). Neither the training loop nor evaluation applies augmentation (both use this
eval transform), so every pass over a split sees the same pixels.

The fp32 steps give exactly the tensor the decode path gives (`PixelTransform.normalize`): on the CPU by
torchvision's own arithmetic, the same kernels; on an accelerator by a lookup table, since a channel's
uint8 value has 256 possible results, computed once by that CPU arithmetic (a GPU's division by a
scalar multiplies by its reciprocal, which can differ in the last bit).

Files, beside the split's manifest: `image_cache/<split>.npy` ([N, 3, H, W] uint8, rows in manifest
order) and `image_cache/<split>.json` (provenance record: the manifest's sha256, the row ids, the
transform's settings, the array's shape and sha256). A cache whose record does not match the manifest
or the transform a job uses is refused with the command that rebuilds it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hnclip.errors import StaleArtifactError, UserError
from hnclip.io import atomic_path, read_json, write_json

CACHE_FORMAT = 1
_TO_TENSOR = ("ToTensor", "MaybeToTensor")


def cache_dir(manifest: str | Path) -> Path:
    return Path(manifest).parent / "image_cache"


def array_path(manifest: str | Path) -> Path:
    return cache_dir(manifest) / f"{Path(manifest).stem}.npy"


def record_path(manifest: str | Path) -> Path:
    return cache_dir(manifest) / f"{Path(manifest).stem}.json"


@dataclass
class PixelTransform:
    """An eval transform split at ToTensor: `pil_steps` make the uint8 image the cache holds;
    `normalize` turns uint8 pixels (any leading dimensions, on any device) into the transform's fp32 output."""
    pil_steps: list
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_preprocess(cls, preprocess) -> "PixelTransform":
        steps = list(getattr(preprocess, "transforms", []))
        names = [type(step).__name__ for step in steps]
        cut = next((i for i, name in enumerate(names) if name in _TO_TENSOR), None)
        if cut is None or names[cut + 1:] != ["Normalize"]:
            raise UserError(f"the image cache needs an eval transform of PIL steps, ToTensor and Normalize; this "
                            f"model's is {names}: set execution.image_cache: false")
        normalize = steps[-1]
        return cls(steps[:cut], tuple(float(m) for m in normalize.mean), tuple(float(s) for s in normalize.std))

    def settings(self) -> dict:
        """What the cached pixels depend on (recorded, and compared before a cache is used)."""
        return {"pil_steps": [repr(step) for step in self.pil_steps], "mean": list(self.mean), "std": list(self.std)}

    def pixels(self, image: Image.Image) -> np.ndarray:
        """[3, H, W] uint8: the PIL steps of one RGB image (as ToTensor receives it)."""
        for step in self.pil_steps:
            image = step(image)
        if image.mode != "RGB":
            raise ValueError(f"the transform's PIL steps gave a {image.mode} image, not RGB")
        return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1)

    def arithmetic(self, pixels: torch.Tensor) -> torch.Tensor:
        """torchvision's ToTensor and Normalize of uint8 [..., 3, H, W] (to_tensor: x.to(float32).div(255);
        normalize: x.sub_(mean).div_(std), mean and std as [3, 1, 1] tensors)."""
        from torchvision.transforms import functional
        return functional.normalize(pixels.to(torch.float32).div(255), list(self.mean), list(self.std))

    def table(self) -> torch.Tensor:
        """[3, 256] fp32: each channel's normalized value of every uint8 value, by `arithmetic` on the CPU."""
        return self.arithmetic(torch.arange(256, dtype=torch.uint8).expand(3, 1, 256)).reshape(3, 256)

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 [..., 3, H, W] -> fp32, on the pixels' device, bit-identical to the transform's output."""
        return self.arithmetic(pixels) if pixels.device.type == "cpu" else self.lookup(pixels)

    def lookup(self, pixels: torch.Tensor) -> torch.Tensor:
        """`arithmetic` by its table, on the pixels' device (one gather)."""
        table = _tables.get((self.mean, self.std, pixels.device))
        if table is None:
            table = _tables[(self.mean, self.std, pixels.device)] = self.table().to(pixels.device)
        channel = torch.arange(3, device=pixels.device).view(3, 1, 1)
        return table[channel, pixels.long()]


_tables: dict = {}   # the lookup table of each (mean, std, device), made once per process


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(16 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()


def write_image_cache(manifest: str | Path, transform: PixelTransform, record_fields: dict | None = None,
                      workers: int = 1) -> Path:
    """Decode every image of a manifest once into its cache (array, then record), in `workers` processes;
    returns the record's path. `record_fields`: what the caller adds to the record (a provenance record's keys)."""
    from hnclip.data.manifest import read_manifest
    from hnclip.hashing import file_sha256
    manifest = Path(manifest)
    rows = read_manifest(manifest)
    started = time.time()
    shape = (len(rows), *_decode(rows[0].image, transform).shape)
    images = [row.image for row in rows]
    with atomic_path(array_path(manifest)) as tmp, _decoding(transform, workers) as decode:
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        for index, pixels in enumerate(decode(images)):  # in manifest order
            if pixels.shape != shape[1:]:
                raise ValueError(f"{images[index]}: the transform gave {pixels.shape}, the first image {shape[1:]}")
            array[index] = pixels
        array.flush()
        del array
        array_sha256 = _file_sha256(tmp)
    record = {**(record_fields or {}), "format": CACHE_FORMAT, "manifest": manifest.name,
              "manifest_sha256": file_sha256(manifest), "ids": [row.id for row in rows],
              "transform": transform.settings(), "shape": list(shape), "dtype": "uint8",
              "array": {"path": array_path(manifest).name, "sha256": array_sha256, "bytes": int(np.prod(shape))},
              "decode_s": round(time.time() - started, 3)}
    write_json(record_path(manifest), record)
    return record_path(manifest)


def _decode(image_path: str, transform: PixelTransform) -> np.ndarray:
    with Image.open(image_path) as image:
        return transform.pixels(image.convert("RGB"))


@contextlib.contextmanager
def _decoding(transform: PixelTransform, workers: int):
    """images -> their pixels in order: here, or in a pool of `workers` processes."""
    if workers <= 1:
        yield lambda images: (_decode(image, transform) for image in images)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield lambda images: pool.imap(functools.partial(_decode, transform=transform), images, chunksize=8)


class CachedPixels:
    """The memory-mapped pixels of one split, checked against its manifest, rows and transform."""

    def __init__(self, manifest: str | Path, row_ids: list[str], transform: PixelTransform):
        manifest = Path(manifest)
        rebuild = f"run `hnclip image-cache --dataset {manifest.parent.name}` (Snakemake's image_cache rule)"
        if not record_path(manifest).is_file() or not array_path(manifest).is_file():
            raise StaleArtifactError(f"{manifest}: no image cache ({cache_dir(manifest)}) though "
                                     f"execution.image_cache is on; {rebuild}")
        from hnclip.hashing import file_sha256
        record = read_json(record_path(manifest))
        problems = [name for name, same in (
            ("format", record.get("format") == CACHE_FORMAT),
            ("manifest", record.get("manifest_sha256") == file_sha256(manifest) and record.get("ids") == row_ids),
            ("transform", record.get("transform") == transform.settings())) if not same]
        if problems:
            raise StaleArtifactError(f"{record_path(manifest)}: the image cache was built for another "
                                     f"{' and '.join(problems)} than this job's; {rebuild}")
        self.transform, self.record = transform, record
        self.path = array_path(manifest)
        self.array = np.load(self.path, mmap_mode="r")
        if list(self.array.shape) != record["shape"]:
            raise StaleArtifactError(f"{self.path}: shape {list(self.array.shape)}, its record says "
                                     f"{record['shape']}; {rebuild}")

    def __len__(self) -> int:
        return self.array.shape[0]

    def take(self, indices) -> torch.Tensor:
        """uint8 [len(indices), 3, H, W] of those rows (a copy: the map stays read-only)."""
        indices = list(indices)
        if indices and indices == list(range(indices[0], indices[0] + len(indices))):
            block = np.array(self.array[indices[0]:indices[0] + len(indices)])  # a contiguous read
        else:
            block = self.array[np.asarray(indices, dtype=np.int64)]
        return torch.from_numpy(block)
