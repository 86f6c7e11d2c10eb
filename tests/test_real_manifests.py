"""Manifests from the real datasets' layouts: tiny fixture archives in each real layout are served by
the local fault server, downloaded and unpacked by download_dataset, and built into manifests."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from helpers.fault_server import FAST
from helpers.payloads import sha256, tar_gz, zip_bytes
from PIL import Image

from hnclip.data.download import download_dataset
from hnclip.data.download_errors import ChecksumMismatch, ManualStepRequired
from hnclip.data.manifest import ManifestRow, read_manifest
from hnclip.data.real import (
    PAPER_TABLE_A1,
    MissingImageError,
    build_dci,
    build_docci,
    build_urban1k,
    build_vg_paragraphs,
    compare_counts,
    token_count,
)
from hnclip.data.sources import get_source

LONG_CAPTION = " ".join(["a red brick wall beside a narrow street"] * 40)  # far over 248 tokens


def jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (seed * 40 % 256, 90, 160)).save(buffer, "JPEG")
    return buffer.getvalue()


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (20, seed * 40 % 256, 60)).save(buffer, "PNG")
    return buffer.getvalue()


def serve_source(server, name: str, blobs: dict[str, bytes], md5: tuple[str, ...] = ()):
    """Serve `blobs` under /<name>/ and return the real source entry pinned to them."""
    pins = {}
    for file_name, data in blobs.items():
        server.add(f"/{name}/{file_name}", data)
        algorithm = "md5" if file_name in md5 else "sha256"
        pins[file_name] = {"checksum": hashlib.new(algorithm, data).hexdigest(), "algorithm": algorithm,
                           "size": len(data)}
    return get_source(name).with_files(pins)


def fetch(server, tmp_path: Path, name: str, blobs: dict[str, bytes], md5: tuple[str, ...] = ()) -> Path:
    source = serve_source(server, name, blobs, md5)
    return download_dataset(name, tmp_path / "data", server.url, source=source, **FAST).dataset_dir


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_row(row_id, image, caption, split, source, short=None) -> dict:
    return {"id": row_id, "image": image, "caption": caption, "short_caption": short, "split": split,
            "source_sha256": sha256(source)}


# ---------------------------------------------------------------------------------------------
# DOCCI
# ---------------------------------------------------------------------------------------------

DOCCI_RECORDS = [
    {"example_id": "train_00000", "split": "train", "image_file": "train_00000.jpg", "description": "A cat."},
    {"example_id": "train_00001", "split": "train", "image_file": "train_00001.jpg", "description": "A dog."},
    {"example_id": "test_00000", "split": "test", "image_file": "test_00000.jpg", "description": "A cup."},
    {"example_id": "test_00001", "split": "test", "image_file": "test_00001.jpg", "description": LONG_CAPTION},
    {"example_id": "qual_test_00000", "split": "qual_test", "image_file": "qual_test_00000.jpg",
     "description": "A pen."},
    {"example_id": "qual_dev_00000", "split": "qual_dev", "image_file": "qual_dev_00000.jpg",
     "description": "A hat."},
]


@pytest.fixture
def docci_dir(server, tmp_path):
    descriptions = "".join(json.dumps(record) + "\n" for record in DOCCI_RECORDS).encode()
    images = tar_gz({f"images/{r['image_file']}": jpeg(i) for i, r in enumerate(DOCCI_RECORDS)})
    goal = json.dumps([{"filename": f"chage/path/to/your/directory/dataset/images/{name}", "caption": "x"}
                       for name in ("qual_test_00000.jpg", "test_00000.jpg", "test_00001.jpg")]).encode()
    dataset_dir = fetch(server, tmp_path, "docci", {"docci_descriptions.jsonlines": descriptions,
                                                    "docci_images.tar.gz": images, "docci_test.json": goal},
                        md5=("docci_images.tar.gz",))
    return dataset_dir, descriptions


@pytest.mark.parametrize("test_set, test_ids", [
    ("test", ["test_00000", "test_00001"]),
    ("test+qual_test", ["test_00000", "test_00001", "qual_test_00000"]),
])
def test_docci_manifests(docci_dir, tmp_path, test_set, test_ids):
    dataset_dir, descriptions = docci_dir
    out = tmp_path / "manifests" / "docci"
    report = build_docci(dataset_dir, out, test_set=test_set)
    by_id = {r["example_id"]: r for r in DOCCI_RECORDS}
    for split, ids in (("train", ["train_00000", "train_00001"]), ("test", test_ids)):
        assert rows_of(out / f"{split}.jsonl") == [
            expected_row(i, f"../../data/docci/extracted/images/{i}.jpg", by_id[i]["description"], split,
                         descriptions) for i in ids]
        assert all(Path(row.image).is_file() for row in read_manifest(out / f"{split}.jsonl"))
    assert report.counts == {"train": 2, "test": len(test_ids)}
    assert report.over_context == {"train": 0.0, "test": pytest.approx(1 / len(test_ids))}
    assert any("qual_dev" in note for note in report.notes)
    goal_note = next(note for note in report.notes if "docci_test.json" in note)
    assert f"{3 - len(test_ids)} of them not in our test set" in goal_note
    assert report.mismatches() == ["docci/train: built 2 rows, paper Table A1 says 9450 (-9448)",
                                   f"docci/test: built {len(test_ids)} rows, paper Table A1 says 5100 "
                                   f"({len(test_ids) - 5100:+d})"]


def test_missing_image_raises_naming_it_and_writes_nothing(docci_dir, tmp_path):
    dataset_dir, _ = docci_dir
    (dataset_dir / "extracted" / "images" / "test_00001.jpg").unlink()
    out = tmp_path / "manifests"
    with pytest.raises(MissingImageError, match=r"test_00001\.jpg.*'test_00001'"):
        build_docci(dataset_dir, out)
    assert not out.exists() or not list(out.glob("*.jsonl"))


# ---------------------------------------------------------------------------------------------
# DCI and Long-DCI (GOAL lists, hand-placed photos for the SA-1B step)
# ---------------------------------------------------------------------------------------------

DCI_IMAGES = [f"sa_{1543970 + i}.jpg" for i in range(6)]
DCI_SPLITS = {"train": DCI_IMAGES[:4], "valid": DCI_IMAGES[4:5], "test": DCI_IMAGES[5:]}
GOAL_TRAIN = DCI_IMAGES[:3]
GOAL_TEST = DCI_IMAGES[3:5]


def dci_annotation(image: str) -> dict:
    n = image[3:-4]
    return {"image": image, "short_caption": f"Short {n}.", "extra_caption": f"Extra about {n}.\nMore.",
            "mask_data": {"0": {"label": "thing", "caption": "c"}}, "mask_keys": ["0"], "summaries": {}}


def dci_blobs() -> dict[str, bytes]:
    splits = {split: [image.replace(".jpg", ".json") for image in images] for split, images in DCI_SPLITS.items()}
    annotations = {f"densely_captioned_images/annotations/{image.replace('.jpg', '.json')}":
                   json.dumps(dci_annotation(image)).encode() for image in DCI_IMAGES}
    archive = tar_gz({"densely_captioned_images/splits.json": json.dumps(splits).encode(), **annotations})
    segments = [{"caption": "seg", "filename": f"chage/path/to/your/directory/{image}_results/"
                 f"{image[:-4]}_max_{k}.png", "similarity_score": 1.0}
                for image in GOAL_TRAIN for k in (1, 2)]  # several segments per image
    first, second = (dci_annotation(image) for image in GOAL_TEST)
    test = [{"filename": f"../DCI/photos/{GOAL_TEST[0]}", "caption": first["extra_caption"]},
            {"filename": f"../DCI/photos/{GOAL_TEST[1]}",
             "caption": f"{second['short_caption']}\n{second['extra_caption']}"}]
    return {"dci.tar.gz": archive, "DCI_test.json": json.dumps(test).encode(),
            "DCI_segment_only_sim_max_del_org.json": json.dumps(segments).encode()}


def place_photos(dataset_dir: Path, images=DCI_IMAGES) -> None:
    photos = dataset_dir / "extracted" / "densely_captioned_images" / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images):
        (photos / image).write_bytes(jpeg(i))


@pytest.fixture
def dci_dir(server, tmp_path):
    blobs = dci_blobs()
    place_photos(tmp_path / "data" / "dci")  # the manual SA-1B step, done by hand beforehand
    return fetch(server, tmp_path, "dci", blobs), blobs["dci.tar.gz"]


def test_dci_and_long_dci_manifests_goal_protocol(dci_dir, tmp_path):
    dataset_dir, archive = dci_dir
    out = tmp_path / "manifests" / "dci"
    report = build_dci(dataset_dir, out)
    photos = "../../data/dci/extracted/densely_captioned_images/photos"

    def expected(images, split, caption_of):
        return [expected_row(image[:-4], f"{photos}/{image}", caption_of(dci_annotation(image)), split, archive,
                             short=dci_annotation(image)["short_caption"]) for image in images]

    assert rows_of(out / "train.jsonl") == expected(GOAL_TRAIN, "train", lambda a: a["extra_caption"])
    assert rows_of(out / "test.jsonl") == expected(GOAL_TEST, "test", lambda a: a["extra_caption"])
    assert rows_of(out / "test_long.jsonl") == expected(
        DCI_IMAGES[:5], "test_long", lambda a: f"{a['short_caption']}\n{a['extra_caption']}")
    assert report.counts == {"train": 3, "test": 2, "test_long": 5}
    assert "GOAL lists: train 3 unique images, test 2, overlap 0, union 5" in report.notes
    assert any("extra 1/2, short+extra 1/2" in note for note in report.notes)
    assert compare_counts(report.counts, PAPER_TABLE_A1["dci"], "dci") == [
        "dci/train: built 3 rows, paper Table A1 says 5445 (-5442)",
        "dci/test: built 2 rows, paper Table A1 says 1999 (-1997)",
        "dci/test_long: built 5 rows, paper Table A1 says 7444 (-7439)"]


def test_dci_official_splits_and_all_images_for_long_dci(dci_dir, tmp_path):
    dataset_dir, _ = dci_dir
    out = tmp_path / "manifests" / "dci_official"
    report = build_dci(dataset_dir, out, split_source="official", caption="short+extra", long_images="splits")
    assert report.counts == {"train": 4, "valid": 1, "test": 1, "test_long": 6}
    (test_row,) = read_manifest(out / "test.jsonl")
    annotation = dci_annotation(DCI_IMAGES[5])
    assert test_row.caption == f"{annotation['short_caption']}\n{annotation['extra_caption']}"


def test_dci_missing_photo_is_named(dci_dir, tmp_path):
    dataset_dir, _ = dci_dir
    (dataset_dir / "extracted" / "densely_captioned_images" / "photos" / DCI_IMAGES[3]).unlink()
    with pytest.raises(MissingImageError, match=DCI_IMAGES[3]):
        build_dci(dataset_dir, tmp_path / "manifests")


def test_dci_without_photos_asks_for_the_manual_step(server, tmp_path, capsys):
    source = serve_source(server, "dci", dci_blobs())
    with pytest.raises(ManualStepRequired) as error:
        download_dataset("dci", tmp_path, server.url, source=source, **FAST)
    message = str(error.value)
    for needle in ("sa_000138.tar", "https://ai.meta.com/datasets/segment-anything-downloads/",
                   str(tmp_path / "dci" / "raw" / "sa_000138.tar"),
                   str(tmp_path / "dci" / "extracted" / "densely_captioned_images" / "photos")):
        assert needle in message
    assert "sa_000138.tar" in capsys.readouterr().err
    assert (tmp_path / "dci" / "extracted" / "densely_captioned_images" / "splits.json").is_file()


def test_dci_sa1b_tar_placed_by_hand_is_verified_and_unpacked(server, tmp_path):
    shard = io.BytesIO()
    with tarfile.open(fileobj=shard, mode="w") as tar:  # SA-1B shards hold <id>.jpg and <id>.json
        for i, image in enumerate(DCI_IMAGES):
            for name, data in ((image, jpeg(i)), (image.replace(".jpg", ".json"), b"{}")):
                info = tarfile.TarInfo(f"./{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = tmp_path / "dci" / "raw"
    raw.mkdir(parents=True)
    (raw / "sa_000138.tar").write_bytes(shard.getvalue())
    source = serve_source(server, "dci", dci_blobs())
    download_dataset("dci", tmp_path, server.url, source=source, **FAST)
    photos = tmp_path / "dci" / "extracted" / "densely_captioned_images" / "photos"
    assert sorted(p.name for p in photos.iterdir()) == DCI_IMAGES  # only the .jpg files, flat
    assert build_dci(tmp_path / "dci", tmp_path / "manifests").counts["test_long"] == 5

    wrong = source.with_files({"sa_000138.tar": {"checksum": "0" * 64}})
    (raw / "sa_000138.tar.complete").unlink()
    with pytest.raises(ChecksumMismatch, match="placed by hand"):
        download_dataset("dci", tmp_path, server.url, source=wrong, **FAST)
    assert (raw / "sa_000138.tar").exists()  # the user's file is never deleted


# ---------------------------------------------------------------------------------------------
# Urban-1K
# ---------------------------------------------------------------------------------------------

URBAN_CAPTIONS = {"1": "A busy street at dusk.", "2": "A tram crossing.", "10": "A glass tower."}


def test_urban1k_manifest(server, tmp_path):
    members = {}
    for i, (n, caption) in enumerate(URBAN_CAPTIONS.items()):
        members[f"Urban1k/image/{n}.jpg"] = jpeg(i)
        members[f"Urban1k/caption/{n}.txt"] = f"{caption}\nA second line that is not the caption.\n".encode()
    archive = zip_bytes(members)
    dataset_dir = fetch(server, tmp_path, "urban1k", {"Urban1k.zip": archive})
    out = tmp_path / "manifests" / "urban1k"
    report = build_urban1k(dataset_dir, out)
    assert rows_of(out / "test.jsonl") == [
        expected_row(n, f"../../data/urban1k/extracted/Urban1k/image/{n}.jpg", URBAN_CAPTIONS[n], "test", archive)
        for n in ("1", "2", "10")]  # natural order
    assert report.counts == {"test": 3} and report.over_context == {"test": 0.0}
    assert report.mismatches() == ["urban1k/test: built 3 rows, paper Table A1 says 1000 (-997)"]


# ---------------------------------------------------------------------------------------------
# Visual Genome paragraphs
# ---------------------------------------------------------------------------------------------

def test_vg_paragraph_manifests(server, tmp_path):
    folder_of = {1: "VG_100K", 2: "VG_100K", 3: "VG_100K", 4: "VG_100K_2", 5: "VG_100K_2", 6: "VG_100K_2"}
    paragraphs = [{"image_id": i, "paragraph": f"  Paragraph {i}. ",
                   "url": f"https://cs.stanford.edu/people/rak248/{folder}/{i}.jpg"} for i, folder in folder_of.items()]
    paragraphs.append({"image_id": 2, "paragraph": "A duplicate.", "url": ""})
    paragraphs_json = json.dumps(paragraphs).encode()
    # as Visual Genome serves it: paragraphs_v1.json zipped (public scripts read it at the zip's root)
    paragraphs_zip = zip_bytes({"paragraphs_v1.json": paragraphs_json})
    blobs = {
        "paragraphs_v1.json.zip": paragraphs_zip,
        "train_split.json": b"[1, 2, 3, 4]", "val_split.json": b"[5]", "test_split.json": b"[6, 99]",
        "images.zip": zip_bytes({f"VG_100K/{i}.jpg": jpeg(i) for i in (1, 2, 3)}),
        "images2.zip": zip_bytes({f"VG_100K_2/{i}.jpg": png(i) for i in (4, 5, 6)}),
    }
    dataset_dir = fetch(server, tmp_path, "vg_paragraphs", blobs)
    out = tmp_path / "manifests" / "vg"
    report = build_vg_paragraphs(dataset_dir, out)
    for split, ids in (("train", [1, 2, 3, 4]), ("val", [5]), ("test", [6])):
        assert rows_of(out / f"{split}.jsonl") == [
            expected_row(str(i), f"../../data/vg_paragraphs/extracted/{folder_of[i]}/{i}.jpg", f"Paragraph {i}.",
                         split, paragraphs_zip) for i in ids]
    assert report.counts == {"train": 4, "val": 1, "test": 1}
    assert "paragraphs_v1.json: 6 images, 1 duplicate image ids (first kept)" in report.notes
    assert any("test_split.json: 1 ids without a paragraph" in note for note in report.notes)
    assert report.mismatches() == ["vg/train: built 4 rows, paper Table A1 says 14579 (-14575)"]


# ---------------------------------------------------------------------------------------------
# Counts and token lengths
# ---------------------------------------------------------------------------------------------

def test_compare_counts_reports_every_mismatch():
    assert compare_counts({"train": 9647, "test": 5100}, PAPER_TABLE_A1["docci"], "docci") == [
        "docci/train: built 9647 rows, paper Table A1 says 9450 (+197)"]
    assert compare_counts({"train": 5446}, PAPER_TABLE_A1["dci"], "dci") == [
        "dci/train: built 5446 rows, paper Table A1 says 5445 (+1)",
        "dci/test: paper Table A1 has 1999 but no such split was built",
        "dci/test_long: paper Table A1 has 7444 but no such split was built"]
    assert compare_counts({"test": 1000}, PAPER_TABLE_A1["urban1k"]) == []


def test_token_count_is_untruncated():
    assert token_count("hello world") == 4  # start + 2 words + end
    assert token_count(LONG_CAPTION) > 248


def test_manifest_rows_use_the_common_schema(docci_dir, tmp_path):
    dataset_dir, _ = docci_dir
    report = build_docci(dataset_dir, tmp_path / "m", token_stats=False)
    rows = read_manifest(report.manifests["train"])
    assert all(isinstance(row, ManifestRow) for row in rows) and report.over_context == {}
