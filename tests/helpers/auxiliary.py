"""Inputs for the auxiliary-input tests: drawn scenes, a fake colour matcher, manifests of them, and a
child process that builds LISM segments with the rehearsal's tiny SAM and CLIP (killed and resumed
by tests/test_auxiliary_shards.py).

    python -m helpers.auxiliary <manifest> <out_dir> <sam_dir> <clip_dir> <shard_images> <batch_images>
prints the build's summary as JSON, with "segmented": the images the segmenter was asked about.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from hnclip.auxiliary.lism import Encoders
from hnclip.data.manifest import ManifestRow, write_manifest

GRAY, RED, GREEN, BLUE = (128, 128, 128), (220, 30, 30), (20, 90, 30), (30, 60, 220)
PALETTE = {"red": RED, "green": GREEN, "blue": BLUE, "gray": GRAY}

SCENES = [  # id, squares (colour, x, y, side), caption
    ("two", [(RED, 2, 2, 10), (BLUE, 20, 24, 12)], "A red square. A blue square."),
    ("three", [(RED, 26, 2, 10), (GREEN, 2, 20, 10), (BLUE, 22, 24, 10)], "Green here. Then red. Also blue."),
    ("same", [(GREEN, 4, 4, 14)], "A green square. Green again. Gray around it."),
    ("empty", [], "Nothing but gray."),
    ("long", [(RED, 2, 2, 12)], "A red square. " + "word " * 80 + "red."),
    ("one", [(BLUE, 10, 10, 15)], "Blue."),
]


def canvas(width: int, height: int, squares: list[tuple[tuple[int, int, int], int, int, int]]) -> Image.Image:
    """Gray image with solid squares (colour, x, y, side)."""
    pixels = np.full((height, width, 3), GRAY, np.uint8)
    for color, x, y, side in squares:
        pixels[y:y + side, x:x + side] = color
    return Image.fromarray(pixels)


def colour_encoders(text_rows: dict[str, list[float]] | None = None, context: int = 77) -> Encoders:
    """Fake matcher: an image's feature is the one-hot of its commonest palette colour; a sentence's
    is `text_rows[word]` for the first palette word it contains (one-hot of that colour by default)."""
    names = list(PALETTE)
    rows = text_rows or {name: list(np.eye(4)[k]) for k, name in enumerate(names)}
    palette = np.array(list(PALETTE.values()), float)

    def encode_images(images):
        out = []
        for image in images:
            pixels = np.asarray(image, float).reshape(-1, 3)
            nearest = np.argmin(((pixels[:, None, :] - palette[None]) ** 2).sum(-1), axis=1)
            out.append(np.eye(4)[np.bincount(nearest, minlength=4).argmax()])
        return np.array(out)

    def encode_texts(texts):
        return np.array([next(rows[w] for w in text.lower().split() if w in rows) for text in texts])

    return Encoders(encode_images, encode_texts, lambda text: len(text.split()) + 2, context, "colours")


def write_scenes(data: Path, scenes=SCENES, copies: int = 1) -> Path:
    """`data/images/<id>.png` for every scene (`copies` times, ids suffixed) and `data/train.jsonl`."""
    (data / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for copy in range(copies):
        for image_id, squares, caption in scenes:
            name = image_id if copies == 1 else f"{image_id}-{copy}"
            canvas(40, 40, squares).save(data / "images" / f"{name}.png")
            rows.append(ManifestRow(name, f"images/{name}.png", caption, None, "train", "0" * 64))
    write_manifest(data / "train.jsonl", rows)
    return data / "train.jsonl"


def write_synthetic(data: Path, n_images: int, seed: int = 3) -> Path:
    """A manifest of `n_images` of the synthetic DOCCI train scenes (64 px, the rehearsal's kind)."""
    from hnclip.data.synthetic import generate_split
    (data / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for sample in generate_split("docci", "train", n_images, seed=seed):
        Image.fromarray(sample.image).save(data / "images" / f"{sample.id}.png")
        rows.append(ManifestRow(sample.id, f"images/{sample.id}.png", sample.caption, None, "train", "0" * 64))
    write_manifest(data / "train.jsonl", rows)
    return data / "train.jsonl"


class Counting:
    """A function wrapped to count its calls and raise on the `fail_at`-th (None: never; settable)."""

    def __init__(self, function, fail_at: int | None = None):
        self.function, self.fail_at, self.calls = function, fail_at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError(f"injected failure on call {self.calls}")
        return self.function(*args, **kwargs)


class CountingSegmenter:
    """A segmenter that counts the images it is asked about (and can fail on the n-th); it names
    itself as the segmenter it wraps."""

    def __init__(self, inner, fail_at: int | None = None):
        self.inner, self.masks = inner, Counting(inner.masks, fail_at)

    @property
    def calls(self) -> int:
        return self.masks.calls

    def fingerprint(self) -> dict:
        from hnclip.auxiliary.segments import segmenter_fingerprint
        return segmenter_fingerprint(self.inner)


def main(argv: list[str]) -> None:
    import torch

    from hnclip.auxiliary.lism import build_lism, hf_clip_encoders
    from hnclip.auxiliary.segments import SamSegmenter

    manifest, out_dir, sam, clip, shard_images, batch_images = argv
    torch.set_num_threads(1)
    segmenter = CountingSegmenter(SamSegmenter(sam))
    summary = build_lism(manifest, out_dir, segmenter, hf_clip_encoders(clip), batch_images=int(batch_images),
                         shard_images=int(shard_images))
    print(json.dumps({**summary, "segmented": segmenter.calls}))


if __name__ == "__main__":
    main(sys.argv[1:])
