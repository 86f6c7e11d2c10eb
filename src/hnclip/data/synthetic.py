"""Procedurally generated dense-caption benchmarks: the CPU miniature of DOCCI / DCI / Long-DCI /
VG paragraphs / Urban-1K, plus a separate corpus for pretraining the tiny backbone.

A scene is a few textured shapes in the cells of a 3x3 grid over a named background. It is
rendered with numpy masks (no antialiasing) and described by templated captions. Every attribute
a caption mentions (shape, colour, size, texture, grid cell, background) is visible in the image,
so retrieval is solvable.

Fine-tuning benchmarks come in *families*: a base scene plus siblings that differ from it in one
edit (one object's colour, shape, texture or size, or two objects swapping cells). Siblings share
their caption templates, so their captions are near-duplicates, like the hard negatives of real
dense-caption benchmarks. Rows are shuffled so that siblings are never adjacent in a manifest.

Everything is a pure function of (seed, variant, split): the same arguments give byte-identical
PNGs and manifests; train and test draw from distinct seed streams.

This module seeds the splits, turns families into a split's rows and writes datasets. The parts:
scenes and family edits (synthetic_scenes.py), rendering (synthetic_images.py), the caption grammar
(synthetic_captions.py); the vocabulary, the variants and the fingerprint: hnclip.config.synthetic_spec.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hnclip.config.synthetic_spec import (  # noqa: F401 - the spec's names are part of this module's API
    CAPTION_STYLE_NAMES,
    CELLS,
    COLORS,
    EDIT_KINDS,
    GENERATOR_OVERRIDES,
    GENERATOR_VERSION,
    MAX_OFFSET,
    SHAPES,
    SIZES,
    STANDARD_BACKGROUNDS,
    TEXTURES,
    URBAN_BACKGROUNDS,
    VARIANTS,
    HeldOutSpec,
    VariantSpec,
    check_sizes,
    check_variant_split,
    dataset_fingerprint,
    edit_kinds_of,
    held_out_colors_of,
    splits_to_write,
    variant_spec,
)
from hnclip.data.manifest import ManifestRow, write_manifest
from hnclip.data.synthetic_captions import scene_captions
from hnclip.data.synthetic_images import encode_png, render_scene
from hnclip.data.synthetic_scenes import Scene, family_scenes
from hnclip.hashing import sha256_bytes

# The vocabulary, the variants and the fingerprint: hnclip.config.synthetic_spec (the registry reads them).


@dataclass(frozen=True, eq=False)
class Sample:
    """One generated row: the scene, its rendered image and its captions."""
    id: str
    split: str
    family: int
    member: int                      # 0 = the family's base scene
    edit: str | None                 # how this member differs from member 0 (None for member 0)
    scene: Scene
    image: np.ndarray                # (H, W, 3) uint8
    caption: str
    short_caption: str | None


# A generated row's id is "<variant>-<scene split>-f<family>-m<member>" (generate_split): siblings
# share everything before "-m", so a manifest carries each row's family in its id.
SAMPLE_ID = re.compile(r"(?P<family>[^-]+-[^-]+-f\d+)-m\d+")


def family_of(sample_id: str) -> str | None:
    """The family of a generated row (its id up to the member suffix), or None for an id this
    generator did not write (real data has no families)."""
    match = SAMPLE_ID.fullmatch(sample_id)
    return match.group("family") if match else None


# ---------------------------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------------------------

def _stable_int(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _split_seeds(seed: int, variant: str, split: str) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """(scene stream, shuffle stream) of one split; distinct splits never share a stream."""
    key = [int(seed), _stable_int(variant), _stable_int(split)]
    return np.random.SeedSequence(key + [0]), np.random.SeedSequence(key + [1])


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------

def _spread_families(families: list[int], rng: np.random.Generator) -> list[int]:
    """A seeded shuffle of row indices, repaired so that no two adjacent rows share a family."""
    n = len(families)
    order = [int(i) for i in rng.permutation(n)]

    def family_at(k: int) -> int:
        return families[order[k]]

    def clashes(k: int) -> bool:
        return (k > 0 and family_at(k) == family_at(k - 1)) or (k + 1 < n and family_at(k) == family_at(k + 1))

    for i in range(1, n):
        if family_at(i) != family_at(i - 1):
            continue
        # Swap in a later row (any clash this creates further on is repaired as the scan goes on),
        # else an earlier one that fits both ways. Tiny splits may have no fix; they keep the clash.
        for j in [*range(i + 1, n), *range(i - 1)]:
            order[i], order[j] = order[j], order[i]
            if family_at(i) != family_at(i - 1) and (j > i or not clashes(j)):
                break
            order[i], order[j] = order[j], order[i]
    return order


def generate_split(variant: str, split: str, n_images: int, seed: int, image_size: int = 64,
                   generator: dict | None = None) -> list[Sample]:
    """The first `n_images` rows of a split, in manifest (shuffled) order."""
    spec = check_variant_split(variant, split, generator)
    if n_images < 1:
        raise ValueError(f"n_images must be positive, got {n_images}")
    if image_size < 24:
        raise ValueError(f"image_size must be at least 24 px, got {image_size}")
    rows, shuffle_seed = _split_rows(spec, variant, split, n_images, seed)
    samples = [Sample(**row, split=split, image=render_scene(row["scene"], image_size)) for row in rows]
    order = _spread_families([s.family for s in samples], np.random.default_rng(shuffle_seed))
    return [samples[i] for i in order]


def _split_rows(spec: VariantSpec, variant: str, split: str, n_images: int,
                seed: int) -> tuple[list[dict], np.random.SeedSequence]:
    """(the split's first `n_images` rows in generation order, without images; the split's shuffle seed)."""
    long_form = split == spec.long_split
    scene_split = "test" if long_form else split  # Long-DCI re-describes the test scenes
    scene_seeds, shuffle_seed = _split_seeds(seed, variant, scene_split)
    n_families = -(-n_images // spec.family_size)
    rows: list[dict] = []
    for family, family_seed in enumerate(scene_seeds.spawn(n_families)):
        scene_seq, caption_seq = family_seed.spawn(2)
        for member, (edit, scene) in enumerate(family_scenes(spec, np.random.default_rng(scene_seq))):
            if len(rows) == n_images:
                break
            caption, short = scene_captions(scene, spec, caption_seq, long_form)
            rows.append({"id": f"{variant}-{scene_split}-f{family:05d}-m{member}", "family": family, "member": member,
                         "edit": edit, "scene": scene, "caption": caption, "short_caption": short})
    return rows, shuffle_seed


def split_edits(variant: str, split: str, n_images: int, seed: int,
                generator: dict | None = None) -> dict[str, tuple[str | None, str]]:
    """{row id: (edit, caption)} of a split as `generate_split` makes it, without rendering: the edit that made
    each sibling from its family's base scene (None for the base), for analyses by edit kind, and the caption,
    with which a reader checks that a manifest is this generator's output for these arguments."""
    spec = check_variant_split(variant, split, generator)
    rows, _ = _split_rows(spec, variant, split, n_images, seed)
    return {row["id"]: (row["edit"], row["caption"]) for row in rows}


# ---------------------------------------------------------------------------------------------
# Writing datasets
# ---------------------------------------------------------------------------------------------

def _replace_dir(built: Path, target: Path) -> None:
    """Move a finished directory onto `target`, replacing any previous one."""
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(built, target)
        shutil.rmtree(old)
    else:
        os.replace(built, target)


def write_dataset(out_dir: str | Path, variant: str, sizes: dict[str, int], seed: int,
                  image_size: int = 64, generator: dict | None = None) -> dict[str, Path]:
    """Write out_dir/images/<id>.png and out_dir/<split>.jsonl for each split; returns {split: manifest}.

    For dci, requesting "test" also writes "test_long" (Long-DCI: the same images with full-length
    captions). `generator` overrides the variant's caption style and family size. The directory is
    built next to out_dir and renamed into place, so readers never see a half-written dataset;
    rerunning replaces it.
    """
    spec = check_sizes(variant, sizes, generator)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".part", dir=out_dir.parent))
    try:
        (building / "images").mkdir()
        for split, n in splits_to_write(spec, sizes).items():
            rows = []
            for sample in generate_split(variant, split, n, seed, image_size, generator):
                image_path = building / "images" / f"{sample.id}.png"
                png = encode_png(sample.image)
                if not image_path.exists():  # test_long shares the test images
                    image_path.write_bytes(png)
                rows.append(ManifestRow(id=sample.id, image=f"images/{sample.id}.png", caption=sample.caption,
                                        short_caption=sample.short_caption, split=split,
                                        source_sha256=sha256_bytes(png)))
            write_manifest(building / f"{split}.jsonl", rows)
        _replace_dir(building, out_dir)
    finally:
        if building.exists():
            shutil.rmtree(building)
    return {split: out_dir / f"{split}.jsonl" for split in splits_to_write(spec, sizes)}
