"""The rehearsal's mirror: a real-format miniature of every file in the paper profile's source table.

`build_mirror(out_dir)` writes `<out_dir>/<source>/<file name>` for every automatic file of every
source in `hnclip.data.sources.SOURCES`, the layout the mirror setting (HNCLIP_MIRROR) serves, and
the hand-placed ones (DCI's SA-1B shard) under `<out_dir>/by_hand/<source>/<file name>`. Each file
has the layout of the real one (DOCCI's jsonlines and image tar, DCI's tar of annotations and split
list, GOAL's split files, Urban-1K's zip, Visual Genome's paragraph zip, split files and image zips,
a Long-CLIP-layout checkpoint, SAM and CLIP as Hub repos hold them), only small: a few dozen images
per dataset, drawn by the synthetic scene generator (`hnclip.data.synthetic`) and saved as JPEG.

The files are a pure function of this module (seeded), so their sha256 are pinned in
`hnclip.data.rehearsal_sources`; `python -m hnclip.rehearsal pins` prints the table again after a
change here, in the generator or in a library that writes them (Pillow, torch, transformers).
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from hnclip.data.sources import SOURCES
from hnclip.rehearsal.archive_writers import tar_bytes, tar_gz, zip_bytes

# How many images each miniature holds. Training sets are large enough for the 5 % subsets of the
# data-fraction study to fill one micro-batch of the rehearsal profile (ceil(0.05 * 64) = 4).
SIZES = {
    "docci": {"train": 64, "test": 24, "qual_test": 8, "qual_dev": 4},
    "dci": {"train": 64, "test": 24, "valid_only": 4},   # valid_only: in splits.json, in neither GOAL list
    "sa1b_unused": 4,                                    # photos of the shard that DCI does not annotate
    "urban1k": {"test": 24},
    "vg": {"train": 32, "val": 4, "test": 4},
}
IMAGE_SIZE = 48   # photos; the backbone resizes them to its 112 px input
SAM_IMAGE_SIZE = 32  # SAM's input side: its post-processing upsamples every mask, at a cost per pixel
SEED = 0
SA1B_FIRST_ID = 1543972  # shard sa_000138 holds SA-1B ids 1543972-1554261
GOAL_PREFIX = "chage/path/to/your/directory"  # as GOAL's released lists spell their placeholder path
LONGCLIP_CONFIG = "longclip-rehearsal"        # the open_clip config of the checkpoint (hnclip/models/configs)
MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "models" / "configs"  # = hnclip.models.factory.CONFIG_DIR


def _jpeg(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _json(obj) -> bytes:
    return json.dumps(obj, indent=None, ensure_ascii=False).encode()


def _samples(variant: str, split: str, n: int):
    from hnclip.data.synthetic import generate_split
    return generate_split(variant, split, n, SEED, image_size=IMAGE_SIZE)


# ---------------------------------------------------------------------------------------------
# One function per source: {file name: bytes}
# ---------------------------------------------------------------------------------------------

def docci_files() -> dict[str, bytes]:
    """docci_descriptions.jsonlines (example_id, split, image_file, description), docci_images.tar.gz
    (images/<image_file>), and GOAL's docci_test.json (test + qual_test, {filename, caption})."""
    sizes = SIZES["docci"]
    held_out = _samples("docci", "test", sizes["test"] + sizes["qual_test"] + sizes["qual_dev"])
    drawn = {"train": _samples("docci", "train", sizes["train"]), "test": held_out[:sizes["test"]],
             "qual_test": held_out[sizes["test"]:sizes["test"] + sizes["qual_test"]],
             "qual_dev": held_out[sizes["test"] + sizes["qual_test"]:]}
    records, images = [], {}
    for split, samples in drawn.items():
        for k, sample in enumerate(samples):
            example_id = f"{split}_{k:05d}"
            records.append({"example_id": example_id, "split": split, "image_file": f"{example_id}.jpg",
                            "description": sample.caption})
            images[f"images/{example_id}.jpg"] = _jpeg(sample.image)
    goal = [{"filename": f"{GOAL_PREFIX}/dataset/images/{r['image_file']}", "caption": r["description"]}
            for r in records if r["split"] in ("test", "qual_test")]
    return {"docci_descriptions.jsonlines": "".join(json.dumps(r) + "\n" for r in records).encode(),
            "docci_images.tar.gz": tar_gz(images), "docci_test.json": _json(goal)}


def _dci_images() -> dict[str, list[tuple[str, object]]]:
    """(SA-1B photo name, sample) per role: GOAL train, GOAL test, valid only (official splits only)."""
    sizes = SIZES["dci"]
    roles = {"train": _samples("dci", "train", sizes["train"]),
             "test": _samples("dci", "test", sizes["test"] + sizes["valid_only"])}
    roles["valid_only"] = roles["test"][sizes["test"]:]
    roles["test"] = roles["test"][:sizes["test"]]
    named, next_id = {}, SA1B_FIRST_ID
    for role, samples in roles.items():
        named[role] = []
        for sample in samples:
            named[role].append((f"sa_{next_id}.jpg", sample))
            next_id += 3  # DCI annotates some of the shard's photos, not every one
    return named


def dci_files() -> dict[str, bytes]:
    """dci.tar.gz (densely_captioned_images/{splits.json, annotations/sa_<id>.json}), GOAL's
    DCI_test.json ({filename, caption}) and DCI_segment_only_sim_max_del_org.json (one entry per
    segment, several per image)."""
    named = _dci_images()
    annotations, members = {}, {}
    for role in ("train", "test", "valid_only"):
        for image, sample in named[role]:
            annotations[image] = {
                "image": image, "short_caption": sample.short_caption, "extra_caption": sample.caption,
                "mask_data": {"0": {"idx": 0, "label": "scene", "caption": sample.short_caption, "parent": -1}},
                "mask_keys": ["0"], "summaries": {}}
    train, test, extra = (named[role] for role in ("train", "test", "valid_only"))
    splits = {"train": [i.replace(".jpg", ".json") for i, _ in train[:-8] + extra[:2]],
              "valid": [i.replace(".jpg", ".json") for i, _ in train[-8:] + extra[2:]],
              "test": [i.replace(".jpg", ".json") for i, _ in test]}
    members["densely_captioned_images/splits.json"] = _json(splits)
    for image, annotation in annotations.items():
        members[f"densely_captioned_images/annotations/{image.replace('.jpg', '.json')}"] = _json(annotation)
    segments = [{"caption": sentence, "filename": f"{GOAL_PREFIX}/{image}_results/{image[:-4]}_max_{k}.png",
                 "similarity_score": round(0.3 - 0.01 * k, 4)}
                for image, sample in train for k, sentence in enumerate(sample.caption.split(". ")[:2], start=1)]
    goal_test = [{"filename": f"../DCI/photos/{image}", "caption": sample.caption} for image, sample in test]
    return {"dci.tar.gz": tar_gz(members), "DCI_test.json": _json(goal_test),
            "DCI_segment_only_sim_max_del_org.json": _json(segments)}


def sa1b_shard() -> bytes:
    """sa_000138.tar as SA-1B ships it: ./sa_<id>.jpg and ./sa_<id>.json for every photo of the shard,
    DCI's and others."""
    named = _dci_images()
    photos = [(image, sample.image) for role in named.values() for image, sample in role]
    unused = _samples("docci", "train", SIZES["sa1b_unused"])
    photos += [(f"sa_{SA1B_FIRST_ID + 1 + 3 * k}.jpg", sample.image) for k, sample in enumerate(unused)]
    members = {}
    for image, pixels in photos:
        members[f"./{image}"] = _jpeg(pixels)
        members[f"./{image.replace('.jpg', '.json')}"] = _json({"image": {"file_name": image}, "annotations": []})
    return tar_bytes(members)


def urban1k_files() -> dict[str, bytes]:
    """Urban1k.zip: Urban1k/image/<n>.jpg and Urban1k/caption/<n>.txt (the caption on the first line)."""
    members = {}
    samples = _samples("urban", "test", SIZES["urban1k"]["test"])
    for n, sample in enumerate(samples, start=1):
        members[f"Urban1k/image/{n}.jpg"] = _jpeg(sample.image)
    for n, sample in enumerate(samples, start=1):
        members[f"Urban1k/caption/{n}.txt"] = f"{sample.caption}\n".encode()
    return {"Urban1k.zip": zip_bytes(members)}


VG_FIRST_ID = 2_400_001


def vg_files() -> dict[str, bytes]:
    """paragraphs_v1.json.zip (paragraphs_v1.json: [{image_id, paragraph, url}]), the three split files
    (arrays of image ids) and images.zip / images2.zip (VG_100K/<id>.jpg, VG_100K_2/<id>.jpg). As in the
    real files, one image has two paragraphs (the first is kept) and one test id has none. One training
    image is an Urban-1K test image, slightly recompressed: the overlap check has something to find."""
    sizes = SIZES["vg"]
    samples = _samples("vg", "train", sum(sizes.values()))
    ids = [VG_FIRST_ID + 7 * k for k in range(len(samples))]
    folder = {image_id: "VG_100K" if k % 2 == 0 else "VG_100K_2" for k, image_id in enumerate(ids)}
    pixels = {image_id: sample.image for image_id, sample in zip(ids, samples)}
    pixels[ids[0]] = _samples("urban", "test", 1)[0].image  # the near-duplicate of Urban-1K's image 1
    paragraphs = [{"image_id": image_id, "paragraph": sample.caption,
                   "url": f"https://cs.stanford.edu/people/rak248/{folder[image_id]}/{image_id}.jpg"}
                  for image_id, sample in zip(ids, samples)]
    paragraphs.append({"image_id": ids[1], "paragraph": "A second paragraph of the same image.",
                       "url": paragraphs[1]["url"]})
    train, val, test = (ids[:sizes["train"]], ids[sizes["train"]:sizes["train"] + sizes["val"]],
                        ids[sizes["train"] + sizes["val"]:])
    archives = {name: {f"{folder[i]}/{i}.jpg": _jpeg(pixels[i]) for i in ids if folder[i] == name}
                for name in ("VG_100K", "VG_100K_2")}
    return {"paragraphs_v1.json.zip": zip_bytes({"paragraphs_v1.json": _json(paragraphs)}, compress=True),
            "train_split.json": _json(train), "val_split.json": _json(val),
            "test_split.json": _json([*test, ids[-1] + 7]),
            "images.zip": zip_bytes(archives["VG_100K"]), "images2.zip": zip_bytes(archives["VG_100K_2"])}


def longclip_files() -> dict[str, bytes]:
    """longclip-L.pt: a Long-CLIP-layout state dict of the architecture in models/configs/longclip-rehearsal.json."""
    import torch

    from hnclip.rehearsal.miniature_models import longclip_layout_state_dict
    config = json.loads((MODEL_CONFIGS / f"{LONGCLIP_CONFIG}.json").read_text())
    vision, text = config["vision_cfg"], config["text_cfg"]
    if vision["width"] != text["width"] or vision["layers"] != text["layers"]:
        raise ValueError(f"{LONGCLIP_CONFIG}: the generator builds towers of one width and depth")
    state_dict = longclip_layout_state_dict(width=vision["width"], layers=vision["layers"], image=vision["image_size"],
                                            patch=vision["patch_size"], embed=config["embed_dim"],
                                            vocab=text["vocab_size"], context=text["context_length"], seed=SEED)
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    return {"longclip-L.pt": buffer.getvalue()}


def _hub_repo_files(save: Callable[[Path], object], names: tuple[str, ...]) -> dict[str, bytes]:
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        save(Path(folder))
        written = {path.name: path.read_bytes() for path in Path(folder).iterdir() if path.is_file()}
    missing = sorted(set(names) - set(written))
    if missing:
        raise RuntimeError(f"the tiny model's save wrote {sorted(written)}, not {missing}")
    return {name: written[name] for name in names}


def sam_files() -> dict[str, bytes]:
    from hnclip.rehearsal.miniature_models import save_tiny_sam
    names = tuple(f.name for f in SOURCES["sam_vit_huge"].files)
    return _hub_repo_files(lambda path: save_tiny_sam(path, image_size=SAM_IMAGE_SIZE, confident=True, seed=SEED),
                           names)


def clip_files() -> dict[str, bytes]:
    from hnclip.rehearsal.miniature_models import save_tiny_clip
    names = tuple(f.name for f in SOURCES["clip_vit_l14_336"].files)
    weights = next(name for name in names if name in ("pytorch_model.bin", "model.safetensors"))
    return _hub_repo_files(lambda path: save_tiny_clip(path, seed=SEED, weights=weights), names)


BUILDERS: dict[str, Callable[[], dict[str, bytes]]] = {
    "docci": docci_files, "dci": dci_files, "urban1k": urban1k_files, "vg_paragraphs": vg_files,
    "longclip_l": longclip_files, "sam_vit_huge": sam_files, "clip_vit_l14_336": clip_files,
}
HAND_PLACED: dict[tuple[str, str], Callable[[], bytes]] = {("dci", "sa_000138.tar"): sa1b_shard}
BY_HAND = "by_hand"


def miniatures() -> dict[str, dict[str, bytes]]:
    """{source: {file name: bytes}} for every file of the public source table, hand-placed ones included.
    A file the table lists and no builder makes is an error naming it (the table changed)."""
    built: dict[str, dict[str, bytes]] = {}
    for name, source in SOURCES.items():
        if name not in BUILDERS:
            raise KeyError(f"the rehearsal mirror has no miniature of source {name!r}: add a builder in {__name__}")
        files = BUILDERS[name]()
        for source_file in source.files:
            if source_file.manual:
                files[source_file.name] = HAND_PLACED[(name, source_file.name)]()
        wanted = {f.name for f in source.files}
        if set(files) != wanted:
            raise KeyError(f"source {name!r} lists {sorted(wanted)}, the rehearsal builds {sorted(files)}: "
                           f"update {__name__}")
        built[name] = files
    return built


def build_mirror(out_dir: str | os.PathLike) -> dict[str, dict[str, Path]]:
    """Write every miniature under `out_dir` (served files at <source>/<name>, hand-placed ones under
    by_hand/<source>/<name>); returns {source: {file name: path}}."""
    out_dir = Path(out_dir)
    written: dict[str, dict[str, Path]] = {}
    for name, files in miniatures().items():
        manual = {f.name for f in SOURCES[name].files if f.manual}
        written[name] = {}
        for file_name, data in files.items():
            path = out_dir / (BY_HAND if file_name in manual else "") / name / file_name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            written[name][file_name] = path
    return written
