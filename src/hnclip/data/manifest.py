"""The one manifest schema every dataset split is written in (JSON lines, one row per image).

Fields:
  id             unique within the split
  image          path of the image file, relative to the manifest's own directory
  caption        the caption used for training/evaluation (full length, untruncated)
  short_caption  a short caption where the source has one, else null
  split          split name (train, test, ...)
  source_sha256  sha256 of the raw source file the row came from (archive, json, or the image itself)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from hnclip.errors import UserError
from hnclip.io import read_jsonl, write_jsonl

FIELDS = ("id", "image", "caption", "short_caption", "split", "source_sha256")


class ManifestError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class ManifestRow:
    id: str
    image: str
    caption: str
    short_caption: str | None
    split: str
    source_sha256: str


def write_manifest(path: str | Path, rows: list[ManifestRow]) -> None:
    ids = [row.id for row in rows]
    if len(set(ids)) != len(ids):
        raise ManifestError(f"{path}: duplicate ids in manifest")
    write_jsonl(path, [asdict(row) for row in rows])


def read_manifest(path: str | Path, check_images: bool = True) -> list[ManifestRow]:
    """Read and validate a manifest; image paths in the result are resolved to absolute paths."""
    path = Path(path)
    rows = []
    for lineno, raw in enumerate(read_jsonl(path), start=1):
        missing = [field for field in FIELDS if field not in raw]
        if missing:
            raise ManifestError(f"{path}:{lineno}: missing field(s) {missing}; expected {list(FIELDS)}")
        image = (path.parent / raw["image"]).resolve()
        if check_images and not image.is_file():
            raise ManifestError(f"{path}:{lineno}: image {raw['image']!r} of row {raw['id']!r} does not exist "
                                f"(looked for {image}); rebuild the dataset or fix the manifest")
        rows.append(ManifestRow(**{**{f: raw[f] for f in FIELDS}, "image": str(image)}))
    if not rows:
        raise ManifestError(f"{path}: manifest is empty")
    return rows
