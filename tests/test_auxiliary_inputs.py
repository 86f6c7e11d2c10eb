"""Auxiliary inputs of the GOAL / StructXLIP baselines: segments, LISM pairs and Canny edge maps."""
from __future__ import annotations

import dataclasses
import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.auxiliary import BLUE, GRAY, RED, SCENES, canvas, colour_encoders, write_scenes
from PIL import Image

from hnclip.auxiliary.edges import (
    EdgeSettings,
    build_edges,
    canny_thresholds,
    edge_map,
    top_matches,
)
from hnclip.auxiliary.lism import (
    LismImage,
    LismSettings,
    backbone_encoders,
    build_lism,
    file_stem,
    hf_clip_encoders,
    lism_rows,
    match_sentences,
    segment_or_fallback,
    sentences,
)
from hnclip.auxiliary.segments import (
    CpuSegmenter,
    SamSegmenter,
    crop_of,
    mask_bbox,
    sam_input,
    segments_of,
)
from hnclip.data.synthetic import generate_split
from hnclip.data.synthetic_images import render_scene
from hnclip.rehearsal.miniature_models import save_tiny_clip, save_tiny_sam


def _box(x: int, y: int, w: int, h: int) -> dict[str, int]:
    return {"x1": x, "y1": y, "x2": x + w, "y2": y + h, "width": w, "height": h}


# --- shared area filter and boxes -----------------------------------------------------------

def test_area_filter_keeps_one_to_eighty_percent_and_crops_the_tight_box():
    image = Image.fromarray(np.arange(10 * 20 * 3, dtype=np.uint32).reshape(10, 20, 3).astype(np.uint8))
    masks = [np.zeros((10, 20), bool) for _ in range(4)]
    masks[0][3, 5] = masks[0][4, 7] = True        # 2 px = 1.0% of 200: kept (bound inclusive)
    masks[1][0, 0] = True                           # 1 px = 0.5%: dropped
    masks[2][:8, :] = True                          # 160 px = 80%: kept
    masks[3][:8, :] = True
    masks[3][9, 19] = True                          # 161 px = 80.5%: dropped
    kept = segments_of(image, masks)
    assert [s.mask_index for s in kept] == [0, 2]
    assert [s.area_fraction for s in kept] == [0.01, 0.8]
    assert kept[0].bbox == {"x1": 5, "y1": 3, "x2": 8, "y2": 5, "width": 3, "height": 2}
    assert kept[1].bbox == _box(0, 0, 20, 8)
    assert np.array_equal(np.asarray(kept[0].crop), np.asarray(image)[3:5, 5:8])
    assert mask_bbox(masks[3]) == _box(0, 0, 20, 10)


# --- CPU segmenter ----------------------------------------------------------------------------

def test_cpu_segmenter_finds_a_solid_and_a_striped_square():
    pixels = np.asarray(canvas(40, 40, [(RED, 4, 6, 10)])).copy()
    pixels[22:34, 20:32] = BLUE
    pixels[24:34:4, 20:32] = (10, 20, 90)           # two-px dark stripes, period 4, like the textures
    pixels[25:34:4, 20:32] = (10, 20, 90)
    kept = segments_of(Image.fromarray(pixels), CpuSegmenter().masks(Image.fromarray(pixels)))
    # the gray background is 1600 - 100 - 144 = 1356 px = 85% > 80%: filtered
    assert sorted(s.bbox["x1"] for s in kept) == [4, 20]
    red, striped = sorted(kept, key=lambda s: s.bbox["x1"])
    assert red.bbox == _box(4, 6, 10, 10) and red.area_fraction == 100 / 1600
    assert striped.bbox == _box(20, 22, 12, 12) and striped.area_fraction == 144 / 1600


def _object_masks(scene) -> list[np.ndarray]:
    """The generator's own object masks: pixels one object changes on an empty plain canvas."""
    empty = render_scene(dataclasses.replace(scene, background="plain gray", objects=()))
    return [np.any(render_scene(dataclasses.replace(scene, background="plain gray", objects=(o,))) != empty, -1)
            for o in scene.objects]


def test_cpu_segmenter_recovers_the_objects_of_synthetic_scenes():
    ious = []
    for sample in generate_split("docci", "test", 12, seed=3):
        image = Image.fromarray(sample.image)
        masks = CpuSegmenter().masks(image)
        found = [s.mask_index for s in segments_of(image, masks)]
        for truth in _object_masks(sample.scene):
            ious.append(max([np.sum(masks[i] & truth) / np.sum(masks[i] | truth) for i in found], default=0.0))
    ious = np.array(ious)
    assert len(ious) >= 50
    assert np.mean(ious >= 0.5) >= 0.9 and ious.mean() >= 0.75


# --- SAM segmenter on a tiny random SamModel ------------------------------------------------

@pytest.fixture(scope="module")
def tiny_sam(tmp_path_factory):
    return save_tiny_sam(tmp_path_factory.mktemp("tiny_sam"), image_size=128)


def test_sam_runs_on_the_thumbnail_with_the_released_settings_and_resizes_masks_back_nearest(tiny_sam):
    segmenter = SamSegmenter(tiny_sam)
    seen = {}

    def generator(image, **kwargs):
        seen.update(size=image.size, **kwargs)
        mask = torch.zeros((61, 2048), dtype=torch.bool)
        mask[:, :1000] = True
        return {"masks": [mask], "scores": torch.ones(1)}

    segmenter.generator = generator
    (mask,) = segmenter.masks(Image.new("RGB", (4001, 120)))
    assert seen == {"size": (2048, 61), "points_per_crop": 32, "pred_iou_thresh": 0.88,
                    "stability_score_thresh": 0.95, "crops_n_layers": 0, "points_per_batch": 128}
    # NEAREST samples thumbnail column floor((x + 0.5) * 2048 / 4001) for original column x
    columns = np.array([int((x + 0.5) * 2048 / 4001) < 1000 for x in range(4001)])
    assert mask.dtype == bool and mask.shape == (120, 4001)
    assert np.array_equal(mask, np.broadcast_to(columns, (120, 4001))) and columns.sum() == 1954


def test_sam_segmenter_returns_boolean_masks_at_the_image_size(tiny_sam):
    segmenter = SamSegmenter(tiny_sam, points_per_side=4, pred_iou_thresh=0.0, stability_score_thresh=0.0,
                             points_per_batch=8)
    small = segmenter.masks(canvas(48, 36, [(RED, 5, 5, 12)]))
    large = segmenter.masks(Image.new("RGB", (4001, 120), GRAY))  # thumbnailed for SAM, masks resized back
    assert small and large
    assert all(m.dtype == bool and m.shape == (36, 48) for m in small)
    assert all(m.dtype == bool and m.shape == (120, 4001) for m in large)


def test_sam_input_thumbnails_only_images_above_4000_by_3000():
    assert sam_input(Image.new("RGB", (4000, 3000))).size == (4000, 3000)
    assert sam_input(Image.new("RGB", (4001, 400))).size == (2048, 205)    # 400 * 2048 / 4001 = 204.7
    assert sam_input(Image.new("RGB", (3000, 3001))).size == (1535, 1536)  # 3000 * 1536 / 3001 = 1535.5


# --- LISM matching ----------------------------------------------------------------------------

def test_sentences_split_on_periods_strip_and_drop_empties():
    assert sentences(" A red square.. The blue one .  ") == ["A red square", "The blue one"]
    assert sentences("no period") == ["no period"]
    assert sentences(" . ") == []


def test_file_stems_are_safe_and_stay_distinct():
    assert file_stem("docci-train-f00001-m0") == "docci-train-f00001-m0"
    assert file_stem("a/b").startswith("a_b-") and file_stem("a b").startswith("a_b-")
    assert len({file_stem("a/b"), file_stem("a b"), file_stem("a_b")}) == 3


def test_match_sentences_takes_each_sentences_argmax_cosine():
    texts = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 2.0]])
    candidates = np.array([[0.0, 3.0], [1.0, 0.0]])       # unnormalised: the match uses cosines
    matches = match_sentences(texts, candidates)
    assert [(m.sentence_index, m.candidate) for m in matches] == [(0, 1), (1, 0), (2, 0)]
    assert [m.similarity for m in matches] == pytest.approx([1.0, 0.8, 1.0])


def _row(image_id, caption, image, segments, encoders, settings, out_dir) -> dict:
    return lism_rows([LismImage(image_id, caption, image, segments, len(segments))], encoders, settings, out_dir)[0]


def _two_square_segments():
    image = canvas(40, 40, [(RED, 2, 2, 10), (BLUE, 20, 24, 12)])
    masks = [np.zeros((40, 40), bool), np.zeros((40, 40), bool)]
    masks[0][2:12, 2:12] = True
    masks[1][24:36, 20:32] = True
    return image, segments_of(image, masks)


def test_lism_keeps_the_max_similarity_segment_and_drops_full_image_matches(tmp_path):
    image, segments = _two_square_segments()
    # cosines: "red" -> red crop 0.8 (full image 0.6); "blue" -> blue crop 0.9; "gray" -> full image 1.0
    rows = {"red": [0.8, 0, 0, 0.6], "blue": [0, 0, 0.9, np.sqrt(1 - 0.81)], "gray": [0, 0, 0, 1.0]}
    caption = "A red square. The gray background. A blue square."
    row = _row("img", caption, image, segments, colour_encoders(rows), LismSettings(), tmp_path)
    assert [(m["sentence"], m["mask_index"]) for m in row["matches"]] == [("A blue square", 1), ("A red square", 0)]
    assert [m["similarity"] for m in row["matches"]] == pytest.approx([0.9, 0.8])
    assert row["segment"] == row["matches"][0]                       # one pair per image: the best
    assert row["segment"]["sentence_index"] == 2 and row["segment"]["bbox"] == _box(20, 24, 12, 12)
    assert row["segment"]["crop_id"] == "img_seg1" and not (tmp_path / "crops").exists()   # a box, no file
    assert row["no_segment"] is None
    with_files = _row("img", caption, image, segments, colour_encoders(rows), LismSettings(crop_files=True), tmp_path)
    crop = np.asarray(Image.open(tmp_path / with_files["segment"]["crop_file"]))
    assert crop.shape == (12, 12, 3) and np.all(crop == BLUE)
    assert [{k: v for k, v in m.items() if k != "crop_file"} for m in with_files["matches"]] == \
        [{k: v for k, v in m.items() if k != "crop_id"} for m in row["matches"]]   # crop_file <-> crop_id only
    assert with_files["segment"]["crop_file"] == "crops/img_seg1.png"

    kept = _row("img", caption, image, segments, colour_encoders(rows),
                    LismSettings(drop_full_image=False), tmp_path)
    assert [m["sentence_index"] for m in kept["matches"]] == [1, 2, 0]   # full image (1.0) now ranks first
    assert kept["segment"]["bbox"] == _box(0, 0, 40, 40) and kept["segment"]["mask_index"] is None


def test_lism_rows_without_a_segment_say_why_and_fall_back_to_the_full_image(tmp_path):
    image, segments = _two_square_segments()
    encoders = colour_encoders(context=6)              # fake count: words + 2 markers
    only_full = _row("a", "Gray all over. Still gray", image, segments, encoders, LismSettings(), tmp_path)
    assert only_full["no_segment"] == "all_matched_full_image" and only_full["matches"] == []
    long_caption = "A red square. A large blue square here."      # 5 words + 2 = 7 > 6 tokens
    assert _row("b", long_caption, image, segments, encoders, LismSettings(), tmp_path)["no_segment"] \
        == "long_sentence"
    truncated = _row("b", long_caption, image, segments, encoders,
                         LismSettings(long_sentence="truncate"), tmp_path)
    assert [m["mask_index"] for m in truncated["matches"]] == [0, 1]
    assert _row("c", "A red square.", image, [], encoders, LismSettings(), tmp_path)["no_segment"] \
        == "no_segments"
    fallback = segment_or_fallback(only_full)
    assert fallback["fallback"] is True and fallback["crop_id"] is None
    assert fallback["sentence"] == "Gray all over. Still gray" and fallback["bbox"] == _box(0, 0, 40, 40)
    assert segment_or_fallback(truncated)["fallback"] is False


# --- real matchers on tiny random models ----------------------------------------------------

@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    chars = string.ascii_lowercase + string.digits + ".,"
    vocab = {c: i for i, c in enumerate(chars)} | {c + "</w>": i + len(chars) for i, c in enumerate(chars)}
    vocab |= {"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1}
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"), image_size=32, patch=8, text_context=20,
                          vocab=vocab, merges=[], weights="model.safetensors")


def test_hf_clip_encoders_match_the_models_own_embeddings(tiny_clip):
    from transformers import CLIPModel, CLIPProcessor
    encoders = hf_clip_encoders(tiny_clip, batch_size=2)
    images = [canvas(40, 30, [(RED, 3, 3, 9)]), canvas(30, 40, []), canvas(32, 32, [(BLUE, 10, 10, 8)])]
    texts = ["a red square", "gray", "b"]
    image_features, text_features = encoders.encode_images(images), encoders.encode_texts(texts)
    model, processor = CLIPModel.from_pretrained(tiny_clip).eval(), CLIPProcessor.from_pretrained(tiny_clip)
    with torch.no_grad():
        reference = model(**processor(text=texts, images=images, return_tensors="pt", padding=True))
    assert image_features.shape == (3, 8) and text_features.shape == (3, 8)
    assert np.allclose(image_features, reference.image_embeds.numpy(), atol=1e-5)
    assert np.allclose(text_features, reference.text_embeds.numpy(), atol=1e-5)
    assert encoders.context_length == 20
    assert encoders.count_tokens("ab c") == 5                  # start, a, b</w>, c</w>, end
    assert encoders.encode_texts(["x" * 40]).shape == (1, 8)   # 42 tokens > 20: truncated, no error


def test_backbone_encoders_wrap_the_open_clip_backbone():
    from hnclip.models.factory import create
    from hnclip.models.towers import encode_text
    backbone = create("hnclip-tiny")
    encoders = backbone_encoders(backbone, batch_size=2)
    features = encoders.encode_images([canvas(64, 64, []), canvas(50, 70, [(RED, 3, 3, 9)]), canvas(64, 64, [])])
    texts = encoders.encode_texts(["a red circle", "blue"])
    assert features.shape == (3, 64) and np.allclose(np.linalg.norm(features, axis=1), 1.0, atol=1e-5)
    assert np.allclose(features[0], features[2], atol=1e-6)
    with torch.no_grad():
        alone = encode_text(backbone.model, backbone.tokenizer(["blue"]))[0].numpy()
    assert np.allclose(texts[1], alone, atol=1e-5)
    assert encoders.context_length == 248 and encoders.count_tokens("a red circle.") == 6


# --- edges -------------------------------------------------------------------------------------

def test_canny_marks_the_border_of_a_square_only():
    pixels = np.zeros((32, 32), np.uint8)
    pixels[8:24, 8:24] = 255
    edges = edge_map(Image.fromarray(pixels), EdgeSettings())
    assert edges.dtype == np.uint8 and set(np.unique(edges)) == {0, 255}
    ring = np.zeros((32, 32), bool)
    ring[7:25, 7:25] = True
    ring[9:23, 9:23] = False                  # one pixel either side of the square's outline
    assert not np.any(edges[~ring])
    for side in (edges[7:9, 8:24], edges[23:25, 8:24], edges[8:24, 7:9], edges[8:24, 23:25]):
        assert np.count_nonzero(side.any(axis=0 if side.shape[0] == 2 else 1)) >= 14


def test_median_thresholds_follow_the_grayscale_median():
    gray = np.array([[0, 10, 50, 90, 100]], np.uint8)       # median 50
    assert canny_thresholds(gray, EdgeSettings(thresholds="median")) == pytest.approx((33.5, 66.5))
    bright = np.full((2, 2), 240, np.uint8)
    assert canny_thresholds(bright, EdgeSettings(thresholds="median")) == pytest.approx((160.8, 255.0))
    assert canny_thresholds(gray, EdgeSettings(low=5, high=9)) == (5, 9)


def test_top_matches_counts_a_repeated_crop_once_when_distinct():
    ranked = [{"crop_id": "a"}, {"crop_file": "crops/a.png"}, {"crop_id": "b"}, {"crop_id": "c"}]
    assert top_matches(ranked, 2, distinct_crops=True) == [ranked[0], ranked[2]]
    assert top_matches(ranked, 2, distinct_crops=False) == ranked[:2]
    assert top_matches(ranked[:1], 2, distinct_crops=True) == ranked[:1]


# --- end to end ------------------------------------------------------------------------------

@pytest.fixture
def built(tmp_path):
    data = tmp_path / "data"
    write_scenes(data)
    out = tmp_path / "aux"
    lism = build_lism(data / "train.jsonl", out, CpuSegmenter(), colour_encoders(), LismSettings(), batch_images=4)
    edges = build_edges(data / "train.jsonl", out / "segments.jsonl", out, EdgeSettings())
    return data, out, lism, edges


def test_build_lism_end_to_end(built):
    data, out, summary, _ = built
    rows = {row["id"]: row for row in map(json.loads, (out / "segments.jsonl").read_text().splitlines())}
    assert list(rows) == [s[0] for s in SCENES]
    assert summary["images"] == 6 and summary["with_segment"] == 4
    assert summary["no_segment"] == {"no_segments": 1, "long_sentence": 1}
    assert summary["mean_segments_kept"] == pytest.approx((2 + 3 + 1 + 0 + 1 + 1) / 6)
    # every colour sentence lands on its square, the "gray" one on the full image (dropped)
    assert [(m["sentence"], m["bbox"]) for m in rows["three"]["matches"]] == [
        ("Green here", _box(2, 20, 10, 10)), ("Then red", _box(26, 2, 10, 10)), ("Also blue", _box(22, 24, 10, 10))]
    assert [m["sentence_index"] for m in rows["same"]["matches"]] == [0, 1]
    assert rows["same"]["segment"]["crop_id"] == rows["same"]["matches"][1]["crop_id"]
    assert not (out / "crops").exists()


def test_crops_cut_from_boxes_are_the_crop_files_pixels_and_goal_reads_them_so(tmp_path):
    from hnclip.auxiliary.batches import _box_crop, _image
    data = tmp_path / "data"
    manifest = write_scenes(data)
    build_lism(manifest, tmp_path / "boxes", CpuSegmenter(), colour_encoders(), LismSettings(), batch_images=4)
    build_lism(manifest, tmp_path / "files", CpuSegmenter(), colour_encoders(), LismSettings(crop_files=True),
               batch_images=4)
    boxes, files = ([json.loads(line) for line in (tmp_path / d / "segments.jsonl").read_text().splitlines()]
                    for d in ("boxes", "files"))
    cut = 0
    for by_box, by_file in zip(boxes, files, strict=True):
        assert [m["crop_id"] for m in by_box["matches"]] == [Path(m["crop_file"]).stem for m in by_file["matches"]]
        strip = [{k: v for k, v in m.items() if k not in ("crop_id", "crop_file")} for m in by_box["matches"]]
        assert strip == [{k: v for k, v in m.items() if k not in ("crop_id", "crop_file")} for m in by_file["matches"]]
        image_file = data / "images" / f"{by_box['id']}.png"
        for box_match, file_match in zip(by_box["matches"], by_file["matches"], strict=True):
            png = tmp_path / "files" / file_match["crop_file"]
            assert np.array_equal(np.asarray(Image.open(png)), np.asarray(crop_of(Image.open(image_file),
                                                                                 box_match["bbox"])))
            as_goal_reads = _box_crop(image_file, box_match["bbox"], lambda im: torch.from_numpy(np.array(im)))
            assert torch.equal(as_goal_reads, _image(png, lambda im: torch.from_numpy(np.array(im))))
            cut += 1
    assert cut == 2 + 3 + 2 + 1   # every match of every scene


def test_build_edges_end_to_end(built):
    data, out, _, summary = built
    rows = {row["id"]: row for row in map(json.loads, (out / "edges.jsonl").read_text().splitlines())}
    assert summary["images"] == 6 and summary["edge_crops"] == 2 + 2 + 1 + 1
    assert [len(rows[i]["crops"]) for i, *_ in SCENES] == [2, 2, 1, 0, 0, 1]
    assert [c["bbox"] for c in rows["three"]["crops"]] == [_box(2, 20, 10, 10), _box(26, 2, 10, 10)]
    for row in rows.values():
        with Image.open(out / row["edge_file"]) as edge_image:
            assert edge_image.mode == "L" and edge_image.size == (40, 40)
            edges = np.asarray(edge_image)
        expected = edge_map(Image.open(data / "images" / f"{row['id']}.png"), EdgeSettings())
        assert np.array_equal(edges, expected) and (np.any(edges) == (row["id"] != "empty"))
        for crop in row["crops"]:
            box = crop["bbox"]
            cut = np.asarray(Image.open(out / crop["edge_crop_file"]))
            assert np.array_equal(cut, edges[box["y1"]:box["y2"], box["x1"]:box["x2"]])
