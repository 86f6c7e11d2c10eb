"""The procedural dense-caption benchmarks: determinism, caption lengths, families of near-duplicates,
the Long-DCI split, the Urban-1K shift, and the on-disk layout."""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hnclip.data.manifest import read_manifest
from hnclip.data.synthetic import (
    STANDARD_BACKGROUNDS,
    URBAN_BACKGROUNDS,
    VARIANTS,
    dataset_fingerprint,
    generate_split,
    write_dataset,
)
from hnclip.data.synthetic_scenes import scene_differences

FAMILY_VARIANTS = [name for name, spec in VARIANTS.items() if spec.family_size > 1]


def _words(text: str) -> int:
    return len(text.split())


def _jaccard(a: str, b: str) -> float:
    x, y = set(a.lower().split()), set(b.lower().split())
    return len(x & y) / len(x | y)


def _families(samples) -> dict[int, dict[int, object]]:
    families = defaultdict(dict)
    for sample in samples:
        families[sample.family][sample.member] = sample
    return families


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def dci_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dci") / "dci"
    write_dataset(out, "dci", {"train": 24, "test": 16}, seed=0)
    return out


# --- determinism and layout on disk ---------------------------------------------------------

def test_same_seed_gives_identical_bytes_and_other_seed_differs(dci_dir, tmp_path):
    again = tmp_path / "again"
    write_dataset(again, "dci", {"train": 24, "test": 16}, seed=0)
    assert _tree_bytes(again) == _tree_bytes(dci_dir)

    other = tmp_path / "other"
    write_dataset(other, "dci", {"train": 24, "test": 16}, seed=1)
    assert (other / "train.jsonl").read_bytes() != (dci_dir / "train.jsonl").read_bytes()
    assert set(_tree_bytes(other).values()).isdisjoint(
        v for k, v in _tree_bytes(dci_dir).items() if k.endswith(".png"))


def test_write_dataset_layout_and_manifests(dci_dir):
    assert sorted(p.name for p in dci_dir.iterdir()) == ["images", "test.jsonl", "test_long.jsonl", "train.jsonl"]
    for split, n in {"train": 24, "test": 16, "test_long": 16}.items():
        raw = [json.loads(line) for line in (dci_dir / f"{split}.jsonl").read_text().splitlines()]
        assert len(raw) == n
        for row in raw:
            assert row["image"] == f"images/{row['id']}.png"  # relative to the manifest
            assert row["split"] == split
            assert row["source_sha256"] == hashlib.sha256((dci_dir / row["image"]).read_bytes()).hexdigest()
        rows = read_manifest(dci_dir / f"{split}.jsonl")
        assert all(Path(r.image).is_file() for r in rows)


def test_returned_paths_and_rerun_replaces(tmp_path):
    out = tmp_path / "docci"
    paths = write_dataset(out, "docci", {"train": 8, "test": 8}, seed=0)
    assert paths == {"train": out / "train.jsonl", "test": out / "test.jsonl"}
    write_dataset(out, "docci", {"test": 4}, seed=1)
    assert sorted(p.name for p in out.iterdir()) == ["images", "test.jsonl"]
    assert len(list((out / "images").iterdir())) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docci"]  # no temporary leftovers


def test_images_are_rgb_uint8_of_the_requested_size(dci_dir):
    for path in list((dci_dir / "images").iterdir())[:10]:
        with Image.open(path) as image:
            assert image.mode == "RGB" and image.size == (64, 64)
    samples = generate_split("urban", "test", 4, seed=0, image_size=96)
    assert all(s.image.shape == (96, 96, 3) and s.image.dtype == np.uint8 for s in samples)


def test_train_and_test_do_not_share_scenes(dci_dir):
    train, test = read_manifest(dci_dir / "train.jsonl"), read_manifest(dci_dir / "test.jsonl")
    assert {r.id for r in train}.isdisjoint(r.id for r in test)
    assert {r.source_sha256 for r in train}.isdisjoint(r.source_sha256 for r in test)
    assert {r.caption for r in train}.isdisjoint(r.caption for r in test)


def test_fingerprint_is_deterministic_and_describes_the_arguments():
    a = dataset_fingerprint("dci", {"test": 16}, seed=0, image_size=64)
    assert a == dataset_fingerprint("dci", {"test": 16}, seed=0, image_size=64)
    assert a["variant"] == "dci" and a["seed"] == 0 and a["sizes"] == {"test": 16, "test_long": 16}
    assert a["digest"] != dataset_fingerprint("dci", {"test": 16}, seed=1)["digest"]
    assert a["digest"] != dataset_fingerprint("dci", {"test": 16}, seed=0, image_size=96)["digest"]


# --- argument checking --------------------------------------------------------------------

def test_unknown_variant_or_split_names_the_allowed_values(tmp_path):
    with pytest.raises(ValueError, match="docci.*dci.*vg.*urban"):
        write_dataset(tmp_path / "x", "coco", {"train": 4}, seed=0)
    with pytest.raises(ValueError, match="allowed: test"):
        generate_split("urban", "train", 4, seed=0)
    with pytest.raises(ValueError, match="allowed"):
        dataset_fingerprint("nope", {"train": 4}, seed=0)
    with pytest.raises(ValueError):
        write_dataset(tmp_path / "x", "docci", {"train": 0}, seed=0)
    assert not (tmp_path / "x").exists()


# --- captions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_caption_lengths_fall_in_the_variant_range(variant):
    spec = VARIANTS[variant]
    lo, hi = spec.word_range
    for split in spec.splits:
        if split == spec.long_split:
            continue
        counts = np.array([_words(s.caption) for s in generate_split(variant, split, 200, seed=0)])
        assert np.mean((counts >= lo) & (counts <= hi)) >= 0.95, (split, counts.min(), counts.max())
        assert counts.max() - counts.min() >= 15  # lengths vary, not one fixed template


def test_pretraining_captions_are_terser_and_worded_differently():
    pretrain = [s.caption for s in generate_split("pretrain", "train", 200, seed=0)]
    docci = [s.caption for s in generate_split("docci", "train", 200, seed=0)]
    assert np.mean([_words(c) for c in pretrain]) < 0.6 * np.mean([_words(c) for c in docci])
    first_sentences = lambda captions: {c.split(".")[0].split(" on a ")[0] for c in captions}  # noqa: E731
    assert first_sentences(pretrain).isdisjoint(first_sentences(docci))
    samples = generate_split("pretrain", "train", 50, seed=0)
    assert {s.member for s in samples} == {0, 1}  # near-duplicate pairs: attributes matter in pretraining


def test_template_wording_varies_across_families():
    openings = {s.caption.split(".")[0].split(" ")[0] for s in generate_split("docci", "test", 80, seed=0)}
    assert len(openings) >= 3


def test_dci_short_captions_are_one_short_sentence():
    for split in ("train", "test"):
        for sample in generate_split("dci", split, 100, seed=0):
            assert sample.short_caption and _words(sample.short_caption) <= 20
            assert sample.short_caption.count(".") == 1 and sample.short_caption.endswith(".")
    assert all(s.short_caption is None for s in generate_split("docci", "test", 20, seed=0))


def test_long_dci_captions_extend_the_test_captions(dci_dir):
    test = {r.id: r for r in read_manifest(dci_dir / "test.jsonl")}
    long = {r.id: r for r in read_manifest(dci_dir / "test_long.jsonl")}
    assert test.keys() == long.keys()
    for id_, row in long.items():
        assert row.image == test[id_].image and row.source_sha256 == test[id_].source_sha256
        short, dense = row.caption.split("\n", 1)
        assert short == test[id_].short_caption and dense.startswith(test[id_].caption)
        assert _words(row.caption) > _words(test[id_].caption) + 15
    counts = [_words(s.caption) for s in generate_split("dci", "test_long", 200, seed=0)]
    longest_test = max(_words(s.caption) for s in generate_split("dci", "test", 200, 0))
    assert max(counts) > 200 and min(counts) >= longest_test * 0.9


# --- families of near-duplicates ---------------------------------------------------------------

@pytest.mark.parametrize("variant", FAMILY_VARIANTS)
def test_siblings_differ_in_one_edit_and_share_almost_all_words(variant):
    split = VARIANTS[variant].splits[0]
    samples = generate_split(variant, split, 200, seed=0)
    families = _families(samples)
    size = VARIANTS[variant].family_size
    assert all(sorted(members) == list(range(size)) for members in families.values())
    edits, overlaps = set(), []
    for members in families.values():
        base = members[0]
        assert base.edit is None
        for member in range(1, size):
            sibling = members[member]
            diffs = scene_differences(base.scene, sibling.scene)
            if sibling.edit == "position":  # two distinct-looking objects exchange cells
                (i, attr_i), (j, attr_j) = diffs
                a, b = base.scene.objects, sibling.scene.objects
                assert attr_i == attr_j == "cell" and (a[i].cell, a[j].cell) == (b[j].cell, b[i].cell)
            else:
                assert diffs == [(diffs[0][0], sibling.edit)]
            edits.add(sibling.edit)
            assert sibling.caption != base.caption
            overlaps.append(_jaccard(sibling.caption, base.caption))
            assert not np.array_equal(sibling.image, base.image)
        assert len({members[m].edit for m in range(1, size)}) == size - 1
    assert edits == {"color", "shape", "texture", "size", "position"}
    # near-duplicates: word-set Jaccard mostly above 0.85; short VG paragraphs dip lowest
    assert min(overlaps) > 0.75 and np.mean(np.array(overlaps) > 0.85) >= 0.95


@pytest.mark.parametrize("variant", FAMILY_VARIANTS)
def test_siblings_are_never_adjacent_in_the_manifest(variant):
    samples = generate_split(variant, VARIANTS[variant].splits[0], 203, seed=3)  # last family partial
    families = [s.family for s in samples]
    assert len(samples) == 203 and len({s.id for s in samples}) == 203
    assert all(a != b for a, b in zip(families, families[1:]))
    # ...and spread out, not merely interleaved: siblings sit far apart on average
    positions = defaultdict(list)
    for index, family in enumerate(families):
        positions[family].append(index)
    spreads = [max(p) - min(p) for p in positions.values() if len(p) > 1]
    assert np.mean(spreads) > 50


# n=7 (families of 4 and 3): the only sibling-free order is 0101010, which the repair scan of
# `_spread_families` does not find (it leaves [1, 0, 1, 0, 1, 0, 0]).
KNOWN_CLASH = pytest.mark.xfail(strict=True, reason="_spread_families misses an order that must start "
                                                    "and end with the larger family")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, pytest.param(7, marks=KNOWN_CLASH), 9])
def test_tiny_splits_are_the_leading_families_of_a_larger_split(n):
    """A split of n rows is the first ceil(n/4) families of any larger split of the same seed, row for
    row (same scene, image and captions), only shuffled; siblings are kept apart wherever an order
    allows it (no family holds more than half the rows, rounded up)."""
    small = generate_split("docci", "test", n, seed=0)
    large = {s.id: s for s in generate_split("docci", "test", 12, seed=0)}
    assert len(small) == len({s.id for s in small}) == n
    family_size = VARIANTS["docci"].family_size
    assert [(s.family, s.member) for s in sorted(small, key=lambda s: s.id)] == \
        [(i // family_size, i % family_size) for i in range(n)]
    for sample in small:
        twin = large[sample.id]
        assert (sample.caption, sample.scene, sample.edit) == (twin.caption, twin.scene, twin.edit)
        assert np.array_equal(sample.image, twin.image)
    families = [s.family for s in small]
    if max(families.count(f) for f in set(families)) <= (n + 1) // 2:
        assert all(a != b for a, b in zip(families, families[1:])), families


def test_ids_record_variant_split_family_and_member():
    for sample in generate_split("vg", "train", 12, seed=0):
        assert sample.id == f"vg-train-f{sample.family:05d}-m{sample.member}"


# --- distributions -----------------------------------------------------------------------------

def test_urban_is_a_shifted_distribution():
    assert set(URBAN_BACKGROUNDS).isdisjoint(STANDARD_BACKGROUNDS)
    urban = generate_split("urban", "test", 200, seed=0)
    docci = generate_split("docci", "test", 200, seed=0)
    assert {s.scene.background for s in urban} == set(URBAN_BACKGROUNDS)
    assert {s.scene.background for s in docci} <= set(STANDARD_BACKGROUNDS)
    assert min(len(s.scene.objects) for s in urban) >= 5
    assert np.mean([len(s.scene.objects) for s in urban]) > np.mean([len(s.scene.objects) for s in docci])
    urban_colors = [o.color for s in urban for o in s.scene.objects]
    docci_colors = [o.color for s in docci for o in s.scene.objects]
    assert urban_colors.count("white") / len(urban_colors) > 1.5 * docci_colors.count("white") / len(docci_colors)


def test_backgrounds_render_differently():
    samples = generate_split("urban", "test", 120, seed=0) + generate_split("docci", "test", 120, seed=0)
    corners = {}  # the top-left corner cell's mean colour is a background signature when it is empty
    for s in samples:
        if all(o.cell != 0 for o in s.scene.objects):
            corners.setdefault(s.scene.background, s.image[:16, :16].reshape(-1, 3).mean(0))
    signatures = list(corners.values())
    assert len(signatures) >= 8
    assert min(np.abs(a - b).sum() for i, a in enumerate(signatures) for b in signatures[i + 1:]) > 5


def test_generator_overrides_set_the_caption_style_and_family_size():
    rows = generate_split("docci", "train", 12, seed=0, generator={"style": "simple", "family_size": 2})
    families = defaultdict(list)
    for row in rows:
        families[row.family].append(row)
    assert sorted(len(members) for members in families.values()) == [2] * 6
    for row in rows:  # simple style: the opening, then exactly one fixed sentence per object
        sentences = row.caption.split(". ")
        assert len(sentences) == 1 + len(row.scene.objects)
        assert sentences[0].endswith(f"shapes on a {row.scene.background} background")
        for obj, sentence in zip(row.scene.objects, sentences[1:]):
            assert sentence.lower().startswith(f"a {obj.size} {obj.color} {obj.shape} with ".lower())
    assert max(r.member for r in generate_split("docci", "train", 12, seed=0)) == 3  # the variant's own families of 4


def test_generator_overrides_are_part_of_the_fingerprint_and_rejected_when_unknown(tmp_path):
    plain = dataset_fingerprint("docci", {"train": 8}, 0)["digest"]
    simple = dataset_fingerprint("docci", {"train": 8}, 0, generator={"style": "simple"})["digest"]
    pairs = dataset_fingerprint("docci", {"train": 8}, 0, generator={"family_size": 2})["digest"]
    assert len({plain, simple, pairs}) == 3
    assert dataset_fingerprint("docci", {"train": 8}, 0, generator={})["digest"] == plain
    with pytest.raises(ValueError, match="unknown caption style 'haiku'; allowed: terse, flowing"):
        write_dataset(tmp_path / "d", "docci", {"train": 8}, 0, generator={"style": "haiku"})
    with pytest.raises(ValueError, match="unknown generator setting"):
        dataset_fingerprint("docci", {"train": 8}, 0, generator={"n_objects": [1, 2]})
    with pytest.raises(ValueError, match="family_size must be an integer from 1 to 6"):
        generate_split("docci", "train", 8, seed=0, generator={"family_size": 9})
    assert not (tmp_path / "d").exists()


# Content of two small splits as the generator made them before hold-outs existed (GENERATOR_VERSION 2): ids,
# captions, edits and pixel arrays (not PNG bytes, which depend on zlib). A change that alters them must bump
# GENERATOR_VERSION and update these.
UNCHANGED_OUTPUTS = {
    ("docci", 0, (("train", 40), ("test", 30)), (("family_size", 2), ("style", "simple"))):
        "1565e16949e28334e621665e22ea1aaca3404382f6092d8a56d4d12e983c7a80",
    ("pretrain", 1, (("train", 40), ("test", 10)), (("style", "simple"),)):
        "1a141793cacd477331807918b76055faf9a93ca8729c7a4fcf15e240b928f85d",
}


@pytest.mark.parametrize("case", list(UNCHANGED_OUTPUTS))
def test_outputs_without_a_hold_out_are_unchanged(case):
    from hnclip.data.synthetic import GENERATOR_VERSION
    variant, seed, sizes, generator = case
    digest = hashlib.sha256()
    for split, n in sizes:
        for s in generate_split(variant, split, n, seed, 64, dict(generator)):
            for part in (s.id.encode(), s.caption.encode(), str(s.short_caption).encode(), s.image.tobytes(),
                         str(s.edit).encode()):
                digest.update(part)
    assert (GENERATOR_VERSION, digest.hexdigest()) == (2, UNCHANGED_OUTPUTS[case])


HOLD_OUT = {"style": "simple", "edit_kinds": ["size", "shape", "texture", "position"],
            "held_out_colors": ["purple", "orange"]}


def test_a_held_out_detail_never_shows_and_is_part_of_the_fingerprint():
    from hnclip.data.synthetic import HeldOutSpec, VariantSpec, variant_spec
    samples = generate_split("pretrain", "train", 300, seed=1, generator=HOLD_OUT)
    assert {s.edit for s in samples} == {None, "size", "shape", "texture", "position"}  # pairs never differ in colour
    families = _families(samples)
    for members in families.values():
        for sibling in list(members.values())[1:]:
            assert "color" not in {attr for _, attr in scene_differences(members[0].scene, sibling.scene)}
    colours = {obj.color for s in samples for obj in s.scene.objects}
    assert colours == {"red", "yellow", "green", "blue", "white", "black"}
    assert not any(word in s.caption for s in samples for word in ("purple", "orange"))
    # the spec records what it holds out, in the vocabulary's order whatever order params.yaml gives
    spec = variant_spec("pretrain", {**HOLD_OUT, "held_out_colors": ["orange", "purple"]})
    assert isinstance(spec, HeldOutSpec) and spec.held_out_colors == ("orange", "purple")
    assert spec.edit_kinds == ("shape", "texture", "size", "position")
    sizes = {"train": 8}
    digests = {name: dataset_fingerprint("pretrain", sizes, 1, generator=g)["digest"] for name, g in {
        "plain": {"style": "simple"}, "both": HOLD_OUT,
        "kinds": {"style": "simple", "edit_kinds": HOLD_OUT["edit_kinds"]},
        "colours": {"style": "simple", "held_out_colors": ["purple"]},
        "nothing held out": {"style": "simple", "edit_kinds": ["position", "color", "size", "shape", "texture"],
                             "held_out_colors": []}}.items()}
    assert len(set(digests.values())) == 4 and digests["nothing held out"] == digests["plain"]
    assert type(variant_spec("pretrain", {"edit_kinds": list(reversed(HOLD_OUT["edit_kinds"])) + ["color"]})) \
        is VariantSpec  # nothing held out: the plain spec, so today's fingerprints stay as they are


def test_hold_outs_are_validated():
    from hnclip.data.synthetic import COLORS, variant_spec
    with pytest.raises(ValueError, match=r"unknown edit_kinds \['hue'\]"):
        generate_split("docci", "train", 8, seed=0, generator={"edit_kinds": ["hue"]})
    with pytest.raises(ValueError, match="family_size 6 needs 5 distinct edit kinds per family"):
        generate_split("docci", "train", 8, seed=0, generator={"family_size": 6, "edit_kinds": ["size", "shape"]})
    with pytest.raises(ValueError, match="leaves 1 colour"):
        generate_split("docci", "train", 8, seed=0, generator={"held_out_colors": list(COLORS)[1:]})
    with pytest.raises(ValueError, match="edit_kinds must name at least one"):
        dataset_fingerprint("docci", {"train": 8}, 0, generator={"edit_kinds": []})
    with pytest.raises(ValueError, match="must be a list of names"):
        variant_spec("docci", {"held_out_colors": "purple"})
