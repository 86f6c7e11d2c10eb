"""Perceptual-hash overlap between a training set and a test set (hnclip.data.overlap)."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hnclip.commands.overlap import check_overlap
from hnclip.data import overlap
from hnclip.data.manifest import ManifestRow, read_manifest, write_manifest
from hnclip.data.synthetic import write_dataset
from hnclip.io import read_json

# ---------------------------------------------------------------------------------------------
# Fixtures: a VG-like training set and an Urban-like test set that hides copies of training images
# ---------------------------------------------------------------------------------------------

def _jpeg(image: Image.Image, quality: int, scale: float = 1.0) -> Image.Image:
    if scale != 1.0:
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def _brighter(image: Image.Image, shift: int) -> Image.Image:
    pixels = np.asarray(image, dtype=np.int16) + shift
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


# How each hidden copy is made from its training image, as (name, transform, file suffix).
COPIES = (
    ("identical", lambda im: im, ".png"),
    ("jpeg_q75", lambda im: _jpeg(im, 75), ".jpg"),
    ("upscaled_jpeg", lambda im: _jpeg(im, 85, scale=2.0), ".jpg"),
    ("downscaled_jpeg", lambda im: _jpeg(im, 90, scale=0.75), ".jpg"),
    ("brighter", lambda im: _brighter(im, 15), ".png"),
    ("darker", lambda im: _brighter(im, -20), ".png"),
)


def _row(id_: str, image: str, split: str) -> ManifestRow:
    return ManifestRow(id=id_, image=image, caption=f"caption of {id_}", short_caption=None, split=split,
                       source_sha256="0" * 64)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("overlap")
    vg = write_dataset(root / "vg", "vg", {"train": 64}, seed=3)["train"]
    urban = write_dataset(root / "urban", "urban", {"test": 12}, seed=3)["test"]
    # One scene per family: a family's one-edit siblings are near-duplicate images by construction
    # (one object recoloured in a 64-px picture), which a perceptual hash rightly calls close.
    train_rows = [row for row in read_manifest(vg) if row.id.endswith("-m0")]
    train = root / "train" / "train.jsonl"
    train.parent.mkdir()
    write_manifest(train, [_row(r.id, str(Path("..") / "vg" / "images" / Path(r.image).name), "train")
                           for r in train_rows])

    test_dir = root / "test"
    (test_dir / "images").mkdir(parents=True)
    test_rows, expected = [], set()
    for (name, transform, suffix), source in zip(COPIES, train_rows):
        image_name = f"images/copy-{name}{suffix}"
        transform(Image.open(source.image).convert("RGB")).save(test_dir / image_name)
        test_rows.append(_row(f"copy-{name}", image_name, "test"))
        expected.add((source.id, f"copy-{name}"))
    test_rows += [_row(r.id, str(Path("..") / "urban" / "images" / Path(r.image).name), "test")
                  for r in read_manifest(urban)]
    test = test_dir / "test.jsonl"
    write_manifest(test, test_rows)
    return {"root": root, "train": train, "test": test, "vg": vg, "expected": expected, "n_train": len(train_rows),
            "urban_ids": {r.id for r in read_manifest(urban)}}


# ---------------------------------------------------------------------------------------------
# Hashes and distances
# ---------------------------------------------------------------------------------------------

def test_dct_matrix_is_the_orthonormal_dct_ii():
    n = 16
    x = np.random.default_rng(0).normal(size=n)
    naive = np.array([sum(x[i] * np.cos(np.pi * (2 * i + 1) * k / (2 * n)) for i in range(n)) for k in range(n)])
    naive *= np.sqrt(2.0 / n)
    naive[0] /= np.sqrt(2.0)
    matrix = overlap._dct_matrix(n)
    assert np.allclose(matrix @ x, naive)
    assert np.allclose(matrix @ matrix.T, np.eye(n))


@pytest.mark.parametrize("method", sorted(overlap.HASHES))
def test_hash_has_hash_size_squared_bits_and_is_deterministic(method, datasets):
    path = read_manifest(datasets["train"])[0].image
    first = overlap.hash_image(path, method)
    assert first == overlap.hash_image(path, method)
    assert first.bit_length() <= overlap.DEFAULT_HASH_SIZE ** 2
    assert overlap.hash_image(path, method, hash_size=8).bit_length() <= 64


def test_exif_rotated_copy_hashes_like_the_original(datasets, tmp_path):
    path = read_manifest(datasets["train"])[0].image
    original = Image.open(path).convert("RGB")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the viewer rotates the stored pixels 90 degrees clockwise
    rotated = tmp_path / "rotated.jpg"
    original.transpose(Image.Transpose.ROTATE_90).save(rotated, quality=95, exif=exif)
    distance = bin(overlap.hash_image(path) ^ overlap.hash_image(rotated)).count("1")
    assert distance <= overlap.DEFAULT_MAX_DISTANCE


def test_threaded_hashing_matches_serial(datasets):
    paths = [row.image for row in read_manifest(datasets["vg"])]
    assert len(paths) >= 64  # enough for the thread pool to be used
    assert overlap.image_hashes(paths, workers=4) == overlap.image_hashes(paths, workers=1)


def test_hamming_matrix_matches_python_popcount():
    rng = np.random.default_rng(1)
    hashes = [int.from_bytes(rng.bytes(32), "big") for _ in range(7)]
    words = overlap.hash_words(hashes)
    assert words.shape == (7, 4) and words.dtype == np.uint64
    expected = np.array([[bin(a ^ b).count("1") for b in hashes] for a in hashes])
    assert np.array_equal(overlap.hamming_matrix(words, words), expected)


def test_close_pairs_crosses_chunk_boundaries():
    rng = np.random.default_rng(2)
    train = overlap.hash_words([int.from_bytes(rng.bytes(32), "big") for _ in range(5)])
    test = np.concatenate([train[[3]], overlap.hash_words([int.from_bytes(rng.bytes(32), "big")
                                                           for _ in range(4)]), train[[1]]])
    train_idx, test_idx, distance = overlap.close_pairs(train, test, max_distance=0, chunk=2)
    assert sorted(zip(train_idx.tolist(), test_idx.tolist())) == [(1, 5), (3, 0)]
    assert distance.tolist() == [0, 0]


def test_unknown_method_and_bad_hash_size_are_rejected(datasets):
    with pytest.raises(ValueError, match="unknown hash method"):
        overlap.find_overlaps(datasets["train"], datasets["test"], method="ahash")
    with pytest.raises(ValueError, match="multiple of 8"):
        overlap.image_hashes([], hash_size=12)


# ---------------------------------------------------------------------------------------------
# Overlaps between manifests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", sorted(overlap.HASHES))
def test_copies_are_found_and_different_images_are_not(method, datasets):
    pairs = overlap.find_overlaps(datasets["train"], datasets["test"], method=method)
    found = {(p.train_id, p.test_id) for p in pairs}
    assert found == datasets["expected"]
    assert not {p.test_id for p in pairs} & datasets["urban_ids"]
    identical = next(p for p in pairs if p.test_id == "copy-identical")
    assert identical.distance == 0
    assert [p.distance for p in pairs] == sorted(p.distance for p in pairs)


def test_unrelated_scenes_are_far_apart(datasets):
    """The margin behind the default threshold: unrelated scenes sit well above it."""
    train = read_manifest(datasets["train"])
    urban = [r for r in read_manifest(datasets["test"]) if r.id in datasets["urban_ids"]]
    hashes = overlap.image_hashes([r.image for r in train + urban])
    distances = overlap.hamming_matrix(overlap.hash_words(hashes[r.image] for r in urban),
                                       overlap.hash_words(hashes[r.image] for r in train))
    assert distances.min() > 1.25 * overlap.DEFAULT_MAX_DISTANCE


def test_drop_overlaps_writes_a_valid_manifest_without_those_ids(datasets, tmp_path):
    pairs = overlap.find_overlaps(datasets["train"], datasets["test"])
    out = tmp_path / "elsewhere" / "train.dedup.jsonl"
    kept = overlap.drop_overlaps(datasets["train"], pairs, out)
    rows = read_manifest(out)  # image paths resolve from the new location
    dropped = {train_id for train_id, _ in datasets["expected"]}
    assert {r.id for r in rows} == {r.id for r in read_manifest(datasets["train"])} - dropped
    assert len(rows) == len(kept) == datasets["n_train"] - len(dropped)
    originals = {r.id: r for r in read_manifest(datasets["train"])}
    assert all(r.image == originals[r.id].image and r.caption == originals[r.id].caption for r in rows)


def test_check_overlap_writes_report_and_filtered_manifest(datasets, tmp_path):
    report_path = tmp_path / "overlap.json"
    out = tmp_path / "train.jsonl"
    report = check_overlap(datasets["train"], datasets["test"], report_path, out_manifest=out)
    assert read_json(report_path) == report
    n_copies = len(datasets["expected"])
    assert report["n_pairs"] == report["n_train_overlapping"] == report["n_test_overlapping"] == n_copies
    assert report["n_train"] == datasets["n_train"]
    assert report["n_kept"] == datasets["n_train"] - n_copies == len(read_manifest(out))
    assert report["hash_bits"] == 256 and report["method"] == "phash"
    assert sum(report["distance_histogram"].values()) == n_copies
    assert {(p["train_id"], p["test_id"]) for p in report["pairs"]} == datasets["expected"]
    assert report["provenance"]["kind"] == "overlap"


def test_no_overlap_keeps_every_row(datasets, tmp_path):
    out = tmp_path / "train.jsonl"
    overlap.drop_overlaps(datasets["train"], [], out)
    assert [r.id for r in read_manifest(out)] == [r.id for r in read_manifest(datasets["train"])]
