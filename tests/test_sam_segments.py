"""The direct SAM path (hnclip.auxiliary.sam_masks) gives the pipeline's masks in the pipeline's order,
and the matcher's tensor preprocessing of boxes gives the features of the PIL crops. On tiny random
models whose prompt decoder is made to predict distinct confident masks (`plant_masks`)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hnclip.auxiliary.lism import LismSettings, hf_clip_encoders, image_segments
from hnclip.auxiliary.sam_masks import DirectSamSegmenter, plant_masks
from hnclip.auxiliary.segments import SamSegmenter, crop_of, segments_of
from hnclip.rehearsal.miniature_models import clip_bpe, save_tiny_clip, save_tiny_sam


@pytest.fixture(scope="module")
def tiny_sam(tmp_path_factory):
    return save_tiny_sam(tmp_path_factory.mktemp("sam"), image_size=128)


def _photo(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize("size", [(96, 64), (50, 90)])
def test_direct_sam_gives_the_pipelines_masks_in_its_order(tiny_sam, size):
    settings = {"points_per_side": 12, "points_per_batch": 40}   # batches of 40 prompts: the last one shorter
    pipeline, direct = SamSegmenter(tiny_sam, **settings), DirectSamSegmenter(tiny_sam, **settings)
    hooks = [plant_masks(model, 10, size, seed=1, points_per_side=12) for model in (pipeline.generator.model,
                                                                                      direct.sam)]
    image = _photo(*size, seed=0)
    expected, found = pipeline.masks(image), direct.masks(image)
    assert len(expected) >= 4 and len(found) == len(expected)
    assert all(a.dtype == b.dtype == bool and np.array_equal(a, b) for a, b in zip(expected, found, strict=True))
    kept = segments_of(image, expected, 0.01, 0.80)
    n_masks, boxes = direct.segments(image, 0.01, 0.80)
    assert n_masks == len(expected) and len(kept) >= 2
    assert [(s.mask_index, s.area_fraction, s.bbox) for s in boxes] == [(s.mask_index, s.area_fraction, s.bbox)
                                                                         for s in kept]
    assert image_segments(direct, image, LismSettings())[1] == boxes
    for hook in hooks:
        hook.remove()


@pytest.mark.parametrize("original", [(64, 96), (90, 50)])   # up- and downsampled, odd ratios
def test_mask_statistics_from_low_res_logits_equal_those_of_the_upsampled_masks(original, monkeypatch):
    """Counts above 1, -1, 0 and the box of > 0, from the outline pixels only, equal the upsampled masks'
    (post_process_masks' chain); masks with a logit on a threshold or a NaN take the full path."""
    from torch.nn import functional as F

    from hnclip.auxiliary import sam_masks
    from hnclip.auxiliary.sam_masks import _geometry, _threshold_statistics, _upsampled_statistics
    monkeypatch.setattr(sam_masks, "BAND_SHARE_LIMIT", 1.0)   # at this tiny size every mask is mostly outline
    upsampled = []
    monkeypatch.setattr(sam_masks, "_upsampled_statistics", lambda logits, geometry: upsampled.append(len(logits))
                        or _upsampled_statistics(logits, geometry))
    generator = torch.Generator().manual_seed(sum(original))
    coarse = torch.randn(24, 1, 8, 8, generator=generator) * 40   # SAM-like: steep outlines
    logits = F.interpolate(coarse, (32, 32), mode="bilinear", align_corners=False)[:, 0]
    logits[0] = 0.0                                  # no pixel above any threshold but -1
    logits[1, 10:20, 5:25] = 1.0                     # pixels exactly on a threshold: upsampled
    logits[2, 3, 4] = float("nan")
    logits[3] += torch.randn(32, 32, generator=generator)   # noisy
    logits[4] = -30.0
    logits[4, 12:14, 12:13] = 30.0                  # a tiny mask
    reshaped = [round(128 * side / max(original)) for side in original]     # SAM's resize to 128, then padded
    geometry = _geometry((32, 32), (128, 128), reshaped, list(original), "cpu")
    counts, boxes = _threshold_statistics(logits, geometry)
    expected_counts, expected_boxes = _upsampled_statistics(logits, geometry)
    assert torch.equal(counts, expected_counts) and torch.equal(boxes, expected_boxes)
    assert upsampled == [2]                          # the mask on a threshold and the one with a NaN
    assert counts[0].tolist() == [0, original[0] * original[1], 0] and boxes[0].tolist() == [0, 0, 0, 0]
    assert 0 < counts[4, 2] < 100 and (counts[:, 0] <= counts[:, 2]).all() and (counts[:, 2] <= counts[:, 1]).all()


def test_direct_sam_halves_its_prompt_batch_on_out_of_memory(tiny_sam, caplog):
    direct = DirectSamSegmenter(tiny_sam, points_per_side=6, points_per_batch=36)
    hook = plant_masks(direct.sam, 6, (64, 64), seed=2, points_per_side=6)
    image = _photo(64, 64, seed=3)
    reference = direct.masks(image)
    forward, calls = direct.sam.forward, []

    def failing_forward(*args, **kwargs):
        calls.append(kwargs["input_points"].shape[1])
        if kwargs["input_points"].shape[1] > 9:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(*args, **kwargs)

    direct.sam.forward = failing_forward
    again = direct.masks(image)
    assert calls == [36, 18, 9, 9, 9, 9] and direct.points_per_batch == 9 and direct.prompt_batch_fallbacks == 2
    assert len(again) == len(reference) and all(np.array_equal(a, b) for a, b in zip(again, reference, strict=True))
    assert "36 prompts per batch ran out of memory; trying 18" in caplog.text
    hook.remove()


def test_matcher_preprocessing_of_boxes_equals_the_processor_on_pil_crops(tmp_path):
    vocab, merges = clip_bpe()
    encoders = hf_clip_encoders(save_tiny_clip(tmp_path / "clip", vocab=vocab, merges=merges))
    image = _photo(150, 97, seed=4)
    boxes = [{"x1": 0, "y1": 0, "x2": 150, "y2": 97}, {"x1": 3, "y1": 5, "x2": 50, "y2": 20},
             {"x1": 100, "y1": 40, "x2": 101, "y2": 97}, {"x1": 10, "y1": 90, "x2": 140, "y2": 93}]
    by_pil = encoders.encode_images([crop_of(image, b) for b in boxes])
    by_box = encoders.encode_boxes([(image, boxes[:2]), (image, boxes[2:])])
    assert by_box.shape == by_pil.shape == (4, 8)
    np.testing.assert_allclose(by_box, by_pil, atol=1e-6)   # the same ops on the same uint8 tensors (CPU)
    assert set(encoders.fingerprint["files"]) >= {"config.json", "pytorch_model.bin", "preprocessor_config.json"}


def test_a_gather_names_the_models_as_the_shard_jobs_do_without_loading_them(tmp_path, tiny_sam):
    import shutil

    from hnclip.commands.auxiliary import _named_only
    vocab, merges = clip_bpe()
    save_tiny_clip(tmp_path / "clip" / "raw", vocab=vocab, merges=merges)
    shutil.copytree(tiny_sam, tmp_path / "sam" / "raw")
    settings = {"segmenter": {"kind": "sam", "source": "sam", "points_per_batch": 64},
                "matcher": {"kind": "hf_clip", "source": "clip"}}
    segmenter, encoders = _named_only(settings, str(tmp_path))
    loaded = DirectSamSegmenter(tmp_path / "sam" / "raw", points_per_batch=64)
    assert segmenter.fingerprint() == loaded.fingerprint() == SamSegmenter(tmp_path / "sam" / "raw",
                                                                           points_per_batch=64).fingerprint()
    real = hf_clip_encoders(tmp_path / "clip" / "raw")
    assert (encoders.name, encoders.fingerprint) == (real.name, real.fingerprint)
    settings["segmenter"]["dtype"] = "bf16"
    assert _named_only(settings, str(tmp_path))[0].fingerprint()["dtype"] == "bf16"


def test_on_the_rehearsal_models_the_new_path_writes_todays_rows_with_crop_ids_for_crop_files(tmp_path):
    import json

    from helpers.auxiliary import write_synthetic

    from hnclip.auxiliary.lism import build_lism
    from hnclip.rehearsal.mirror import SAM_IMAGE_SIZE
    sam = save_tiny_sam(tmp_path / "sam", image_size=SAM_IMAGE_SIZE, confident=True, seed=0)
    vocab, merges = clip_bpe()
    encoders = hf_clip_encoders(save_tiny_clip(tmp_path / "clip", vocab=vocab, merges=merges))
    manifest = write_synthetic(tmp_path / "data", 4)
    today = build_lism(manifest, tmp_path / "today", SamSegmenter(sam), encoders, LismSettings(crop_files=True),
                       batch_images=4)
    new = build_lism(manifest, tmp_path / "new", DirectSamSegmenter(sam), encoders, LismSettings(), batch_images=4)
    assert today["with_segment"] >= 2 and {k: v for k, v in today.items() if k not in ("wall_s", "settings")} == \
        {k: v for k, v in new.items() if k not in ("wall_s", "settings")}
    rows = {d: [json.loads(line) for line in (tmp_path / d / "segments.jsonl").read_text().splitlines()]
            for d in ("today", "new")}
    for old, fresh in zip(rows["today"], rows["new"], strict=True):
        for match in old["matches"] + ([old["segment"]] if old["segment"] else []):
            match["crop_id"] = match.pop("crop_file").removeprefix("crops/").removesuffix(".png")
        assert old == fresh    # the one difference: crops/<name>.png -> crop_id <name>
