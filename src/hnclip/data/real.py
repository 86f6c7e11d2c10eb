"""Manifest builders: each real dataset's own layout -> our common manifest schema (manifest.py).

Every builder takes a dataset folder as `download_dataset` leaves it (`raw/` with the downloaded
files, `extracted/` with the unpacked archives) plus the protocol options, writes one manifest per
split into `out_dir` (images relative to it), and returns a BuildReport: row counts per split, the
fraction of captions longer than Long-CLIP's 248-token context, and notes on everything that
deviates from the paper. `source_sha256` is the sha256 of the raw file the row's caption came from.

Protocol options (the papers disagree, so these are explicit and recorded):
  DOCCI test set:  "test" (5,000, FineLIP) or "test+qual_test" (5,100, GOAL; the paper's Table A1).
  DCI splits:      "goal" (GOAL's train list and DCI_test.json: 5,446 / 1,999) or "official" (splits.json).
  DCI caption:     "extra" (GOAL's captions) or "short+extra" (short + "\\n" + extra, DCI's full text).
  Long-DCI images: "goal" (GOAL train + test, 7,445) or "splits" (every splits.json image, 7,805);
                   written as the DCI split "test_long" with the full-length caption.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

from hnclip.config.constants import CONTEXT_LENGTH as LONG_CONTEXT
from hnclip.data.manifest import ManifestError, ManifestRow, write_manifest
from hnclip.data.verified_files import recorded_sha256
from hnclip.io import read_json, read_jsonl

# The paper's Table A1 (#train, #test), keyed like params.yaml's datasets; Long-DCI is DCI's
# "test_long" split, and Urban-1K's training set (14,579) is VG paragraphs' train split.
PAPER_TABLE_A1: dict[str, dict[str, int]] = {
    "docci": {"train": 9450, "test": 5100},
    "dci": {"train": 5445, "test": 1999, "test_long": 7444},
    "vg": {"train": 14579},
    "urban1k": {"test": 1000},
}

DOCCI_TEST_SETS = {"test": ("test",), "test+qual_test": ("test", "qual_test")}
DCI_CAPTIONS: dict[str, Callable[[dict], str]] = {
    "extra": lambda annotation: annotation["extra_caption"],
    "short+extra": lambda annotation: f"{annotation['short_caption']}\n{annotation['extra_caption']}",
}
DCI_SPLIT_SOURCES = ("goal", "official")
LONG_DCI_IMAGES = ("goal", "splits")
GOAL_DCI_TEST = "DCI_test.json"
GOAL_DCI_TRAIN = "DCI_segment_only_sim_max_del_org.json"
GOAL_DOCCI_TEST = "docci_test.json"
_SA_IMAGE = re.compile(r"(sa_\d+)\.jpg")


class MissingImageError(ManifestError):
    pass


@dataclass
class BuildReport:
    dataset: str
    counts: dict[str, int]
    manifests: dict[str, Path]
    over_context: dict[str, float] = field(default_factory=dict)  # split -> fraction over 248 tokens
    notes: list[str] = field(default_factory=list)

    def mismatches(self, expected: Mapping[str, int] | None = None) -> list[str]:
        """Every difference from the paper's Table A1 (or `expected`), as readable lines."""
        reference = PAPER_TABLE_A1.get(self.dataset, {}) if expected is None else expected
        return compare_counts(self.counts, reference, label=self.dataset)


def compare_counts(counts: Mapping[str, int], expected: Mapping[str, int], label: str = "") -> list[str]:
    """One human-readable line per split whose count differs from `expected` (or is missing)."""
    prefix = f"{label}/" if label else ""
    lines = []
    for split, want in expected.items():
        have = counts.get(split)
        if have is None:
            lines.append(f"{prefix}{split}: paper Table A1 has {want} but no such split was built")
        elif have != want:
            lines.append(f"{prefix}{split}: built {have} rows, paper Table A1 says {want} ({have - want:+d})")
    return lines


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _tokenizer():
    from open_clip.tokenizer import SimpleTokenizer  # imported late: it pulls in torch
    return SimpleTokenizer()


def token_count(caption: str) -> int:
    """Untruncated CLIP BPE length, counting the start and end tokens as the 248 context does."""
    return len(_tokenizer().encode(caption)) + 2


def fraction_over_context(captions: Iterable[str], context: int = LONG_CONTEXT) -> float:
    """Share of captions that Long-CLIP would truncate (a caption of exactly `context` tokens fits)."""
    lengths = [token_count(caption) for caption in captions]
    return sum(length > context for length in lengths) / len(lengths) if lengths else 0.0


def _row(out_dir: Path, row_id: str, image: Path, caption: str, split: str, source_sha256: str,
         short_caption: str | None = None) -> ManifestRow:
    if not image.is_file():
        raise MissingImageError(f"image {image} of row {row_id!r} (split {split!r}) does not exist; "
                                f"is the dataset fully downloaded and unpacked?")
    return ManifestRow(id=row_id, image=os.path.relpath(image, out_dir), caption=caption,
                       short_caption=short_caption, split=split, source_sha256=source_sha256)


def _finish(dataset: str, out_dir: Path, rows_by_split: dict[str, list[ManifestRow]], notes: list[str],
            token_stats: bool) -> BuildReport:
    """Write the manifests only after every split was built (a missing image writes nothing)."""
    empty = [split for split, rows in rows_by_split.items() if not rows]
    if empty:
        raise ManifestError(f"{dataset}: split(s) {empty} came out empty; check the raw files and options")
    report = BuildReport(dataset=dataset, counts={}, manifests={}, notes=notes)
    for split, rows in rows_by_split.items():
        path = out_dir / f"{split}.jsonl"
        write_manifest(path, rows)
        report.counts[split] = len(rows)
        report.manifests[split] = path
        if token_stats:
            report.over_context[split] = fraction_over_context(row.caption for row in rows)
    return report


def _dirs(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike) -> tuple[Path, Path, Path]:
    dataset_dir = Path(dataset_dir)
    out_dir = Path(out_dir).resolve()
    return dataset_dir / "raw", (dataset_dir / "extracted").resolve(), out_dir


def _raw_sha256(raw: Path, name: str) -> str:
    path = raw / name
    if not path.is_file():
        raise ManifestError(f"{path} not found: run download_dataset for this source first")
    return recorded_sha256(path)


def _choice(name: str, value: str, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, not {value!r}")


# ---------------------------------------------------------------------------------------------
# DOCCI
# ---------------------------------------------------------------------------------------------

def build_docci(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                test_set: str = "test+qual_test", token_stats: bool = True) -> BuildReport:
    """raw/docci_descriptions.jsonlines (example_id, split, image_file, description) +
    extracted/images/<image_file> -> train.jsonl and test.jsonl."""
    _choice("test_set", test_set, DOCCI_TEST_SETS)
    raw, extracted, out = _dirs(dataset_dir, out_dir)
    descriptions = raw / "docci_descriptions.jsonlines"
    sha = _raw_sha256(raw, descriptions.name)
    target_split = {"train": "train", **{split: "test" for split in DOCCI_TEST_SETS[test_set]}}
    rows: dict[str, list[ManifestRow]] = {"train": [], "test": []}
    official: dict[str, int] = {}
    for record in read_jsonl(descriptions):
        official[record["split"]] = official.get(record["split"], 0) + 1
        split = target_split.get(record["split"])
        if split is not None:
            rows[split].append(_row(out, record["example_id"], extracted / "images" / record["image_file"],
                                    record["description"], split, sha))
    notes = [f"official DOCCI splits: {dict(sorted(official.items()))}; test manifest = {test_set}"]
    notes += _compare_with_goal_docci(raw / GOAL_DOCCI_TEST, rows["test"])
    return _finish("docci", out, rows, notes, token_stats)


def _compare_with_goal_docci(goal_list: Path, test_rows: list[ManifestRow]) -> list[str]:
    if not goal_list.is_file():
        return [f"{goal_list.name} not present: test set not cross-checked against GOAL's list"]
    goal = {Path(entry["filename"]).name for entry in read_json(goal_list)}
    ours = {Path(row.image).name for row in test_rows}
    return [f"GOAL {goal_list.name}: {len(goal)} images; {len(goal - ours)} of them not in our test set, "
            f"{len(ours - goal)} of ours not in it"]


# ---------------------------------------------------------------------------------------------
# DCI and Long-DCI
# ---------------------------------------------------------------------------------------------

def build_dci(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, *, split_source: str = "goal",
              caption: str = "extra", long_images: str = "goal", long_caption: str = "short+extra",
              token_stats: bool = True) -> BuildReport:
    """extracted/densely_captioned_images/{splits.json, annotations/*.json, photos/} (+ GOAL's lists
    in raw/) -> train.jsonl, test.jsonl (plus valid.jsonl with official splits) and test_long.jsonl."""
    _choice("split_source", split_source, DCI_SPLIT_SOURCES)
    _choice("caption", caption, DCI_CAPTIONS)
    _choice("long_images", long_images, LONG_DCI_IMAGES)
    _choice("long_caption", long_caption, DCI_CAPTIONS)
    raw, extracted, out = _dirs(dataset_dir, out_dir)
    base = extracted / "densely_captioned_images"
    annotations, official = _load_dci_annotations(base)
    sha = _raw_sha256(raw, "dci.tar.gz")
    official_counts = {split: len(images) for split, images in official.items()}
    notes = [f"official DCI splits.json: {official_counts}"]

    goal = _goal_dci_splits(raw) if "goal" in (split_source, long_images) else {}
    if goal:
        notes += _goal_dci_notes(goal, raw / GOAL_DCI_TEST, annotations)
    splits = goal if split_source == "goal" else official
    long_set = sorted(set(goal["train"]) | set(goal["test"])) if long_images == "goal" \
        else [image for images in official.values() for image in images]

    def rows_for(images: list[str], split: str, style: str) -> list[ManifestRow]:
        return [_dci_row(out, base / "photos", annotations, image, split, DCI_CAPTIONS[style], sha)
                for image in images]

    rows = {split: rows_for(images, split, caption) for split, images in splits.items()}
    rows["test_long"] = rows_for(long_set, "test_long", long_caption)
    notes.append(f"captions: {caption} for {sorted(splits)}; Long-DCI (test_long) = {long_images} images "
                 f"with {long_caption}")
    return _finish("dci", out, rows, notes, token_stats)


def _load_dci_annotations(base: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """{image file: {short_caption, extra_caption}} and {official split: [image file]}; the heavy
    mask data of each annotation is dropped right after reading."""
    splits_file = base / "splits.json"
    if not splits_file.is_file():
        raise ManifestError(f"{splits_file} not found: is dci.tar.gz unpacked into {base.parent}?")
    folder = next((base / name for name in ("annotations", "complete") if (base / name).is_dir()), None)
    if folder is None:
        raise ManifestError(f"no annotations/ (or complete/) folder under {base}")
    annotations: dict[str, dict] = {}
    official: dict[str, list[str]] = {}
    for split, files in read_json(splits_file).items():
        official[split] = []
        for file_name in files:
            data = read_json(folder / file_name)
            annotations[data["image"]] = {"short_caption": data["short_caption"],
                                          "extra_caption": data["extra_caption"]}
            official[split].append(data["image"])
    return annotations, official


def _dci_row(out: Path, photos: Path, annotations: dict[str, dict], image: str, split: str,
             caption_of: Callable[[dict], str], sha: str) -> ManifestRow:
    annotation = annotations.get(image)
    if annotation is None:
        raise ManifestError(f"DCI image {image!r} (split {split!r}) has no annotation in splits.json")
    return _row(out, Path(image).stem, photos / image, caption_of(annotation), split, sha,
                short_caption=annotation["short_caption"])


def _sa_image(entry: dict, list_name: str) -> str:
    path = entry.get("original_filename") or entry["filename"]
    match = _SA_IMAGE.search(path)
    if match is None:
        raise ManifestError(f"{list_name}: cannot find an sa_<id>.jpg image name in {path!r}")
    return f"{match.group(1)}.jpg"


def _goal_dci_splits(raw: Path) -> dict[str, list[str]]:
    """GOAL's train list (one entry per segment: unique images, first-seen order) and test list."""
    lists = {"train": raw / GOAL_DCI_TRAIN, "test": raw / GOAL_DCI_TEST}
    for path in lists.values():
        if not path.is_file():
            raise ManifestError(f"{path} not found: download the dci source (GOAL split lists) or use "
                                f"split_source='official' and long_images='splits'")
    return {split: list(dict.fromkeys(_sa_image(entry, path.name) for entry in read_json(path)))
            for split, path in lists.items()}


def _goal_dci_notes(goal: dict[str, list[str]], test_list: Path, annotations: dict[str, dict]) -> list[str]:
    overlap = set(goal["train"]) & set(goal["test"])
    union = set(goal["train"]) | set(goal["test"])
    notes = [f"GOAL lists: train {len(goal['train'])} unique images, test {len(goal['test'])}, "
             f"overlap {len(overlap)}, union {len(union)}"]
    same = {style: 0 for style in DCI_CAPTIONS}
    entries = read_json(test_list)
    for entry in entries:
        annotation = annotations.get(_sa_image(entry, test_list.name))
        if annotation is None:
            continue
        for style, caption_of in DCI_CAPTIONS.items():
            if entry["caption"] == caption_of(annotation):
                same[style] += 1
    notes.append(f"GOAL {test_list.name} captions identical to the annotation's: "
                 + ", ".join(f"{style} {count}/{len(entries)}" for style, count in same.items()))
    return notes


# ---------------------------------------------------------------------------------------------
# Urban-1K
# ---------------------------------------------------------------------------------------------

def build_urban1k(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                  token_stats: bool = True) -> BuildReport:
    """extracted/Urban1k/{image/<n>.jpg, caption/<n>.txt} -> test.jsonl; the caption is the
    file's first line, the image is named like the caption (as Long-CLIP's evaluation does)."""
    raw, extracted, out = _dirs(dataset_dir, out_dir)
    root = _find_urban_root(extracted)
    archive = next(iter(sorted(raw.glob("*.zip"))), None)
    if archive is None:
        raise ManifestError(f"no Urban-1K zip in {raw}")
    sha = recorded_sha256(archive)
    rows = []
    for caption_file in sorted((root / "caption").glob("*.txt"), key=_natural_key):
        with open(caption_file, encoding="utf-8") as handle:
            caption = handle.readline().strip()
        rows.append(_row(out, caption_file.stem, root / "image" / f"{caption_file.stem}.jpg", caption, "test", sha))
    notes = [f"Urban-1K read from {root.relative_to(extracted) if root != extracted else '.'} of {archive.name}"]
    return _finish("urban1k", out, {"test": rows}, notes, token_stats)


def _find_urban_root(extracted: Path) -> Path:
    candidates = [extracted, *sorted(p for p in extracted.glob("*") if p.is_dir()),
                  *sorted(p for p in extracted.glob("*/*") if p.is_dir())]
    for folder in candidates:
        if (folder / "caption").is_dir() and (folder / "image").is_dir():
            return folder
    raise ManifestError(f"no folder with image/ and caption/ under {extracted}: is the Urban-1K zip unpacked?")


def _natural_key(path: Path) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem))


# ---------------------------------------------------------------------------------------------
# Visual Genome paragraphs
# ---------------------------------------------------------------------------------------------

VG_SPLITS = {"train": "train_split.json", "val": "val_split.json", "test": "test_split.json"}
VG_IMAGE_FOLDERS = ("VG_100K", "VG_100K_2")


def build_vg_paragraphs(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
                        token_stats: bool = True) -> BuildReport:
    """extracted/paragraphs_v1.json ([{image_id, paragraph, url}], from raw/paragraphs_v1.json.zip) +
    raw/{train,val,test}_split.json (image ids) + extracted/VG_100K*/<image_id>.jpg -> train/val/test.jsonl."""
    raw, extracted, out = _dirs(dataset_dir, out_dir)
    paragraphs_file = extracted / "paragraphs_v1.json"
    sha = _raw_sha256(raw, "paragraphs_v1.json.zip")  # the rows' source: the downloaded archive
    by_id: dict[int, dict] = {}
    duplicates = 0
    for entry in read_json(paragraphs_file):
        duplicates += int(entry["image_id"]) in by_id
        by_id.setdefault(int(entry["image_id"]), entry)  # keep the first paragraph of an image
    notes = [f"paragraphs_v1.json: {len(by_id)} images, {duplicates} duplicate image ids (first kept)"]
    rows: dict[str, list[ManifestRow]] = {}
    for split, file_name in VG_SPLITS.items():
        ids = [int(image_id) for image_id in read_json(raw / file_name)]
        missing = [image_id for image_id in ids if image_id not in by_id]
        if missing:
            notes.append(f"{file_name}: {len(missing)} ids without a paragraph, skipped (e.g. {missing[:5]})")
        rows[split] = [_row(out, str(image_id), _vg_image(extracted, by_id[image_id]),
                            by_id[image_id]["paragraph"].strip(), split, sha)
                       for image_id in ids if image_id in by_id]
    return _finish("vg", out, rows, notes, token_stats)


def _vg_image(extracted: Path, entry: dict) -> Path:
    """VG_100K or VG_100K_2, as the paragraph's url says, else whichever holds the image."""
    name = f"{int(entry['image_id'])}.jpg"
    url_folder = str(entry.get("url", "")).rstrip("/").split("/")[-2:-1]
    folders = [*url_folder, *(f for f in VG_IMAGE_FOLDERS if f not in url_folder)]
    for folder in folders:
        if (extracted / folder / name).is_file():
            return extracted / folder / name
    return extracted / folders[0] / name  # missing: the error names the expected place


BUILDERS: dict[str, Callable[..., BuildReport]] = {
    "docci": build_docci,
    "dci": build_dci,
    "vg": build_vg_paragraphs,
    "urban1k": build_urban1k,
}
