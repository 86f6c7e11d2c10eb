"""Near-duplicate images between a training set and a test set, by perceptual hash. The library side of
one concept at two layers: the command that runs it (`hnclip overlap`) is `hnclip.commands.overlap`.

Urban-1K's images may come from Visual Genome (provenance unverified), and our Urban-1K models are
fine-tuned on VG paragraphs; a test image that also sits in the training set would turn "zero-shot
transfer" into memorisation. This module finds such pairs and writes a training manifest without them.

Two hashes, in PIL + numpy only (scipy is not in the environment; the DCT of pHash is a matrix
product, so it needs none):

* pHash (default): signs of the hash_size x hash_size lowest 2-D DCT frequencies of a 4x larger
  grayscale thumbnail against their median.
* dHash: signs of horizontal brightness gradients of a (hash_size + 1) x hash_size thumbnail.

Both are insensitive to uniform brightness shifts, resizing and JPEG recompression. The default
hash_size is 16 (256 bits, four uint64 words), not the common 8 (64 bits): on the embedded benchmarks
64-bit pHashes of *unrelated* VG and Urban-1K scenes come within 4 bits of each other while q50 JPEG or
+30 brightness copies drift to 6, so no 64-bit threshold separates them. At 256 bits, pHash copies stay
<= 20 bits apart (q50 JPEG, half-size resize, +30 brightness) and unrelated scenes >= 48 (random pairs:
~128); dHash copies <= 26, unrelated >= 82. Hence the default threshold of 32 bits. Real photographs
were not available to calibrate on; re-check the report's distance histogram on the real data.

A perceptual hash cannot tell a one-edit sibling from a copy (the synthetic benchmarks' families,
one object recoloured in a 64-px image, are close): the check is meant across datasets.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
from PIL import Image, ImageOps

from hnclip.data.manifest import ManifestRow, read_manifest, write_manifest

DEFAULT_HASH_SIZE = 16       # 16 x 16 = 256 bits per image (see the module docstring)
DCT_OVERSAMPLING = 4          # pHash's DCT runs on a thumbnail 4x the hash side, as in the usual pHash
DEFAULT_MAX_DISTANCE = 32     # bits out of 256
DEFAULT_METHOD = "phash"


class Overlap(NamedTuple):
    train_id: str
    test_id: str
    distance: int             # Hamming distance between the two images' hashes, in bits


# ---------------------------------------------------------------------------------------------
# Hashes of one image
# ---------------------------------------------------------------------------------------------

def _grayscale_thumbnail(image: Image.Image, width: int, height: int) -> np.ndarray:
    return np.asarray(image.convert("L").resize((width, height), Image.Resampling.LANCZOS), dtype=np.float64)


def _bits_to_int(bits: np.ndarray) -> int:
    """A boolean array (row-major) -> the unsigned integer with those bits, first = most significant."""
    return int.from_bytes(np.packbits(bits.ravel().astype(np.uint8)).tobytes(), "big")


def dhash(image: Image.Image, hash_size: int = DEFAULT_HASH_SIZE) -> int:
    """Difference hash: is each thumbnail pixel brighter than its left neighbour?"""
    pixels = _grayscale_thumbnail(image, hash_size + 1, hash_size)
    return _bits_to_int(pixels[:, 1:] > pixels[:, :-1])


@functools.lru_cache(maxsize=4)
def _dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix C: C @ x is scipy.fft.dct(x, norm="ortho")."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    matrix = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    matrix[0] /= np.sqrt(2.0)
    return matrix


def phash(image: Image.Image, hash_size: int = DEFAULT_HASH_SIZE) -> int:
    """Perceptual hash: the lowest hash_size x hash_size 2-D DCT frequencies above their median.

    The median leaves out the DC term (mean brightness), so a global brightness shift moves no bit.
    """
    side = DCT_OVERSAMPLING * hash_size
    pixels = _grayscale_thumbnail(image, side, side)
    dct = _dct_matrix(side)
    low = (dct @ pixels @ dct.T)[:hash_size, :hash_size]
    return _bits_to_int(low > np.median(low.ravel()[1:]))


HASHES = {"phash": phash, "dhash": dhash}


def _check_hash(method: str, hash_size: int) -> None:
    if method not in HASHES:
        raise ValueError(f"unknown hash method {method!r}; allowed: {', '.join(HASHES)}")
    if hash_size < 8 or hash_size % 8:
        raise ValueError(f"hash_size must be a positive multiple of 8 (whole uint64 words), got {hash_size}")


def _open_small(path: str | Path, hash_size: int) -> Image.Image:
    """Open an image, letting JPEG decode at reduced scale: VG photos are ~500 px, the hash needs ~64."""
    image = Image.open(path)
    side = 2 * DCT_OVERSAMPLING * hash_size
    image.draft("L", (side, side))  # no-op for other formats; JPEG keeps at least `side` px per side
    return image


def hash_image(path: str | Path, method: str = DEFAULT_METHOD, hash_size: int = DEFAULT_HASH_SIZE) -> int:
    """Hash of the image as displayed: EXIF orientation applied, since a re-encoded copy may have
    baked the rotation into its pixels."""
    with _open_small(path, hash_size) as image:
        return HASHES[method](ImageOps.exif_transpose(image), hash_size)


def image_hashes(paths: Iterable[str | Path], method: str = DEFAULT_METHOD, hash_size: int = DEFAULT_HASH_SIZE,
                 workers: int | None = None) -> dict[str, int]:
    """{path: hash as an unsigned int of hash_size**2 bits}; decoding runs on a thread pool (PIL
    releases the GIL while it decodes)."""
    _check_hash(method, hash_size)
    paths = list(dict.fromkeys(str(p) for p in paths))
    workers = workers or min(8, os.cpu_count() or 1)
    if workers == 1 or len(paths) < 64:
        return {p: hash_image(p, method, hash_size) for p in paths}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(paths, pool.map(lambda p: hash_image(p, method, hash_size), paths)))


# ---------------------------------------------------------------------------------------------
# Hamming distances, vectorised on uint64 words
# ---------------------------------------------------------------------------------------------

def hash_words(hashes: Iterable[int], hash_size: int = DEFAULT_HASH_SIZE) -> np.ndarray:
    """[n, hash_size**2 / 64] uint64 array: each hash split into big-endian 64-bit words."""
    n_bytes = hash_size * hash_size // 8
    raw = b"".join(h.to_bytes(n_bytes, "big") for h in hashes)
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(-1, n_bytes // 8)


def _popcount(values: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(values)
    as_bytes = values[..., None].view(np.uint8)
    return np.unpackbits(as_bytes, axis=-1).sum(axis=-1, dtype=np.uint8)


def hamming_matrix(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """[len(left), len(right)] Hamming distances between two [n, words] uint64 hash arrays."""
    return _popcount(left[:, None, :] ^ right[None, :, :]).sum(axis=-1, dtype=np.int64)


def close_pairs(train: np.ndarray, test: np.ndarray, max_distance: int,
                chunk: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train index, test index, distance) of every pair within max_distance bits.

    Test hashes are taken `chunk` at a time so memory stays at chunk x n_train x words.
    """
    found = [np.empty(0, dtype=np.int64)] * 3
    for start in range(0, len(test), chunk):
        distance = hamming_matrix(test[start:start + chunk], train)
        test_idx, train_idx = np.nonzero(distance <= max_distance)
        found = [np.concatenate(pair) for pair in
                 zip(found, (train_idx, test_idx + start, distance[test_idx, train_idx]))]
    return found[0], found[1], found[2]


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------

def find_overlaps(train_manifest: str | Path, test_manifest: str | Path,
                  max_distance: int = DEFAULT_MAX_DISTANCE, method: str = DEFAULT_METHOD,
                  hash_size: int = DEFAULT_HASH_SIZE, workers: int | None = None) -> list[Overlap]:
    """Every (train_id, test_id, distance) whose images' hashes are within max_distance bits, sorted
    by distance. A test image may match several training images (and vice versa)."""
    _check_hash(method, hash_size)
    if not 0 <= max_distance <= hash_size * hash_size:
        raise ValueError(f"max_distance must be in [0, {hash_size * hash_size}] bits, got {max_distance}")
    train_rows, test_rows = read_manifest(train_manifest), read_manifest(test_manifest)
    hashes = image_hashes([row.image for row in train_rows + test_rows], method, hash_size, workers)
    train_hashes = hash_words((hashes[row.image] for row in train_rows), hash_size)
    test_hashes = hash_words((hashes[row.image] for row in test_rows), hash_size)
    train_idx, test_idx, distances = close_pairs(train_hashes, test_hashes, max_distance)
    pairs = [Overlap(train_rows[i].id, test_rows[j].id, int(d))
             for i, j, d in zip(train_idx, test_idx, distances)]
    return sorted(pairs, key=lambda p: (p.distance, p.train_id, p.test_id))


def _relative_to(row: ManifestRow, directory: Path) -> ManifestRow:
    """read_manifest resolves image paths; the schema stores them relative to the manifest's directory."""
    return dataclasses.replace(row, image=os.path.relpath(row.image, directory))


def drop_overlaps(train_manifest: str | Path, overlaps: Iterable[Overlap | tuple],
                  out_manifest: str | Path) -> list[ManifestRow]:
    """Write `out_manifest`: the training rows minus every row that overlaps a test image."""
    dropped = {pair[0] for pair in overlaps}
    out_dir = Path(out_manifest).resolve().parent
    kept = [_relative_to(row, out_dir) for row in read_manifest(train_manifest) if row.id not in dropped]
    write_manifest(out_manifest, kept)
    return kept


def overlap_report(train_manifest: str | Path, test_manifest: str | Path, overlaps: list[Overlap],
                   max_distance: int, method: str, hash_size: int = DEFAULT_HASH_SIZE) -> dict:
    """Counts and pairs, JSON-ready."""
    n_train = len(read_manifest(train_manifest, check_images=False))
    n_test = len(read_manifest(test_manifest, check_images=False))
    return {
        "train_manifest": str(train_manifest), "test_manifest": str(test_manifest),
        "method": method, "hash_bits": hash_size * hash_size, "max_distance": max_distance,
        "n_train": n_train, "n_test": n_test, "n_pairs": len(overlaps),
        "n_train_overlapping": len({p.train_id for p in overlaps}),
        "n_test_overlapping": len({p.test_id for p in overlaps}),
        "distance_histogram": {str(d): n for d, n in sorted(Counter(p.distance for p in overlaps).items())},
        "pairs": [p._asdict() for p in overlaps],
    }
