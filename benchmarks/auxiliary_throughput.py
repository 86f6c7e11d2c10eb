"""GOAL's LISM segment extraction, seconds per image by part: today's path against the new one.

    .venv/bin/python benchmarks/auxiliary_throughput.py [--device cpu|cuda] [--repeats 2] [--kept-masks 60]
        [--sizes docci:3,vg:3,dci:1]   (sizes in order, each with its own repeats if given)

Runs the real segments code (hnclip.auxiliary.segments / sam_masks / lism) with SAM ViT-H's and
CLIP ViT-L/14-336's real architectures (transformers SamConfig / CLIPConfig of facebook/sam-vit-huge
and openai/clip-vit-large-patch14-336, built from config with random weights: no download here) at
the three training sets' image sizes: DCI ~3.4 MP (SA-1B photos, 2250 x 1500), DOCCI ~1.5 MP
(1500 x 1000), VG ~0.19 MP (500 x 375).

Random weights keep no mask, so `plant_masks` makes the prompt decoder predict `--kept-masks`
distinct confident masks (half under 1 % of the image: the area filter drops them); every prompt
inside one predicts it in its three outputs, the others fail the IoU filter. Default 60: GOAL's
released DCI pairs (datasets/DCI_segment_only_sim_max_del_org.json @34f018e, 5,446 images) name
the matched mask's index in SAM's output (`..._max_{i+1}.png`): mean 30.5, median 16, 90th
percentile 79; if the matched mask's index were uniform over the masks, that is ~2 x 30.5 = 61 masks
per image (derived under that assumption; the half-below-1 % share is assumed).

Paths (alternated within each repeat, on the same images):
  today: transformers' mask-generation pipeline (fp32, prompts in batches of 128), segments_of on
         the host masks, CLIPProcessor on PIL crops, a PNG per matched crop;
  new:   DirectSamSegmenter (same masks; mask statistics from the low-res logits, no mask upsampled),
         boxes only, the processor's tensor path on the device.
Each row also holds the 1-minute load average before and after each image (`load_avg_1min_each`: a
shared machine's pairs are comparable only side by side) and whether the new path's segments (mask
index, area, box) equal today's on each image (`same_segments_as_today`).
Parts: decode (JPEG to RGB), image_encoder, prompt_decoding (the model's forward over the prompts,
hook excluded), mask_postprocess (the rest of the segmenter plus the area filter), match_preprocess
(crop, resize, normalise, tokenise, similarities), match_encode (CLIP forwards), write (PNGs).
On the CPU the big forwards are measured once and reused (`estimated_parts`): SAM's image encoder
(its input is always 1024 x 1024, so one timing serves every size), its prompt decoder (once per
prompt batch size; the planting hook overwrites the outputs) and CLIP's image tower (one timing per
crop, times the crops). On CUDA every call is measured.
Results are appended to benchmarks/results/auxiliary_throughput.jsonl.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hnclip.auxiliary import lism as lism_module  # noqa: E402
from hnclip.auxiliary.lism import LismImage, LismSettings, hf_clip_encoders, image_segments, lism_rows  # noqa: E402
from hnclip.auxiliary.sam_masks import DirectSamSegmenter, plant_masks  # noqa: E402
from hnclip.auxiliary.segments import SamSegmenter  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "auxiliary_throughput.jsonl"
SIZES = {"dci": (2250, 1500), "docci": (1500, 1000), "vg": (500, 375)}
KEPT_SOURCE = ("derived: GOAL's released DCI_segment_only_sim_max_del_org.json @34f018e, matched mask index mean 30.5 "
               "over 5,446 images, x2 if uniform over the masks (assumed); half under 1 % of the image (assumed)")
CAPTION = ("A red car is parked on the street. Two people walk past a shop window. The sky is pale blue with "
           "thin clouds. A dog sits near the door. Trees line the far side of the road. A bicycle leans on a "
           "lamp post. The building has tall windows. Shadows fall across the pavement.")


def sam_vit_huge_dir(root: Path) -> Path:
    """facebook/sam-vit-huge's architecture (its config.json's vision settings), random weights."""
    from transformers import SamConfig, SamImageProcessor, SamModel, SamVisionConfig
    path = root / "sam-vit-huge"
    if not (path / "config.json").exists():
        vision = SamVisionConfig(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16,
                                 global_attn_indexes=[7, 15, 23, 31], mlp_dim=5120)
        torch.manual_seed(0)
        SamModel(SamConfig(vision_config=vision.to_dict())).save_pretrained(path)
        SamImageProcessor().save_pretrained(path)   # longest edge 1024, padded to 1024 x 1024
    return path


def clip_large_336_dir(root: Path) -> Path:
    """openai/clip-vit-large-patch14-336's architecture and preprocessing, random weights, CLIP's BPE."""
    from transformers import CLIPConfig, CLIPModel

    from hnclip.rehearsal.miniature_models import save_tiny_clip
    path = root / "clip-vit-large-patch14-336"
    if not (path / "model.safetensors").exists():
        save_tiny_clip(path, image_size=336, patch=14, weights="model.safetensors")   # processor and tokenizer
        text = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                "max_position_embeddings": 77, "vocab_size": 49408}
        vision = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
                  "image_size": 336, "patch_size": 14}
        torch.manual_seed(0)
        tokenizer_ids = json.loads((path / "config.json").read_text())["text_config"]
        text.update({k: tokenizer_ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "vocab_size")})
        CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=768)).save_pretrained(path)
    return path


class Clock:
    """Seconds spent in wrapped calls, by part (CUDA synchronised)."""

    def __init__(self, device: torch.device):
        self.device, self.parts, self.spent = device, {}, {}   # reported seconds; seconds really spent

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def add(self, part: str, seconds: float, spent: float | None = None) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds
        self.spent[part] = self.spent.get(part, 0.0) + (seconds if spent is None else spent)

    def wrap(self, owner, name: str, part: str, reuse_after_first: bool = False, per_item=None):
        """Time owner.name; with reuse_after_first, later calls return the first call's output (cached
        by the output's shape per item count) and count the first call's time (per item if per_item)."""
        inner = getattr(owner, name)
        cache: dict = {}

        def timed(*args, **kwargs):
            if reuse_after_first and "first" in cache:
                n = per_item(args, kwargs) if per_item else 1
                self.add(part, cache["seconds_per_item"] * n, spent=0.0)
                return cache["make"](n)
            self.sync()
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            self.sync()
            seconds = time.perf_counter() - start
            self.add(part, seconds)
            if reuse_after_first:
                n = per_item(args, kwargs) if per_item else 1
                cache.update(first=True, seconds_per_item=seconds / n)
                sample = out if isinstance(out, torch.Tensor) else out.pooler_output
                cache["make"] = (lambda k, s=sample: s.detach()) if not per_item else (
                    lambda k, s=sample: torch.randn(k, s.shape[-1], device=s.device))
            return out

        setattr(owner, name, timed)


def write_jpeg(path: Path, size: tuple[int, int], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (size[1] // 50 + 1, size[0] // 50 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize(size, Image.BICUBIC)   # smooth regions, as photos compress
    noisy = np.clip(np.asarray(image, np.int16) + rng.integers(-12, 12, (size[1], size[0], 3)), 0, 255)
    Image.fromarray(noisy.astype(np.uint8)).save(path, quality=90)
    return path


def one_image(path_kind: str, segmenter, encoders, image_file: Path, clock: Clock, out_dir: Path) -> dict:
    clock.parts, clock.spent = {}, {}
    settings = LismSettings(crop_files=(path_kind == "today"))
    start = time.perf_counter()
    image = lism_module.decode_rgb(image_file)
    clock.add("decode", time.perf_counter() - start)
    clock.sync()
    start = time.perf_counter()
    n_masks, segments = image_segments(segmenter, image, settings)
    clock.sync()
    segment_s = time.perf_counter() - start
    start = time.perf_counter()
    rows = lism_rows([LismImage("bench", CAPTION, image, segments, n_masks)], encoders, settings, out_dir)
    clock.sync()
    match_s = time.perf_counter() - start
    parts, spent = dict(clock.parts), clock.spent
    parts["mask_postprocess"] = segment_s - spent.get("image_encoder", 0) - spent.get("prompt_decoding", 0) \
        - spent.get("plant_hook", 0)
    parts["match_preprocess"] = match_s - spent.get("match_encode", 0) - spent.get("write", 0)
    parts.pop("plant_hook", None)
    parts.setdefault("write", 0.0)
    return {"parts_s": parts, "kept_masks": n_masks, "segments_kept": len(segments),
            "segments": [(s.mask_index, s.area_fraction, s.bbox) for s in segments],
            "matches": len(rows[0]["matches"]), "no_segment": rows[0]["no_segment"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kept-masks", type=int, default=60)
    parser.add_argument("--sizes", default="docci,vg,dci",
                        help="sizes in order, each optionally with its own repeats: docci:3,vg:3,dci:1")
    parser.add_argument("--models", default=os.environ.get("HNCLIP_BENCH_MODELS",
                                                           str(Path(tempfile.gettempdir()) / "hnclip-bench-models")))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    models = Path(args.models)
    sam_path, clip_path = sam_vit_huge_dir(models), clip_large_336_dir(models)

    direct = DirectSamSegmenter(sam_path, device=str(device))
    from transformers import pipeline
    pipe = SamSegmenter.__new__(SamSegmenter)   # today's class around the same model object (memory)
    pipe.model = str(sam_path)
    pipe.generator = pipeline("mask-generation", model=direct.sam, image_processor=direct.processor,
                              points_per_batch=128, device=device)
    pipe.settings = {"points_per_crop": 32, "pred_iou_thresh": 0.88, "stability_score_thresh": 0.95,
                     "crops_n_layers": 0, "points_per_batch": 128}
    encoders = hf_clip_encoders(clip_path, device=str(device))

    clock = Clock(device)
    sam = direct.sam
    clock.wrap(sam, "get_image_embeddings", "image_encoder", reuse_after_first=cpu)
    forward, decoded = sam.forward, {}

    def timed_forward(*a, **k):
        batch = k["input_points"].shape[1]
        if cpu and batch in decoded:   # the same computation for every batch of this size: timed once
            clock.add("prompt_decoding", decoded[batch][0], spent=0.0)
            return decoded[batch][1]
        clock.sync()
        start = time.perf_counter()
        out = forward(*a, **k)
        clock.sync()
        decoded[batch] = (time.perf_counter() - start, out)
        clock.add("prompt_decoding", decoded[batch][0])
        return out
    sam.forward = timed_forward
    from transformers import CLIPModel
    texts = getattr(encoders.encode_texts, "__wrapped__", encoders.encode_texts)
    clip = next(c.cell_contents for c in texts.__closure__ if isinstance(c.cell_contents, CLIPModel))
    clock.wrap(clip, "get_image_features", "match_encode", reuse_after_first=cpu,
               per_item=lambda a, k: k["pixel_values"].shape[0])
    clock.wrap(clip, "get_text_features", "match_encode")
    write_png = lism_module._write_png

    def timed_write(*a, **k):
        start = time.perf_counter()
        write_png(*a, **k)
        clock.add("write", time.perf_counter() - start)
    lism_module._write_png = timed_write

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({args.threads} threads)"
    work = Path(tempfile.mkdtemp(prefix="hnclip-bench-"))
    for size_spec in args.sizes.split(","):
        size_name, _, repeats = size_spec.partition(":")
        size = SIZES[size_name]
        runs: dict[str, list[dict]] = {"today": [], "new": []}
        for repeat in range(int(repeats or args.repeats)):
            image_file = write_jpeg(work / f"{size_name}-{repeat}.jpg", size, seed=repeat)
            order = ("today", "new") if repeat % 2 == 0 else ("new", "today")
            for kind in order:
                handle = plant_masks(sam, args.kept_masks, size, seed=repeat,
                                     on_time=lambda seconds: clock.add("plant_hook", seconds))
                segmenter = pipe if kind == "today" else direct
                load_before = os.getloadavg()[0]   # the machine may be shared: the pairs' load, side by side
                result = one_image(kind, segmenter, encoders, image_file, clock, work / kind)
                result["load_avg_1min"] = [load_before, os.getloadavg()[0]]
                handle.remove()
                runs[kind].append(result)
                print(size_name, kind, repeat, json.dumps({k: v for k, v in result.items() if k != "segments"}),
                      flush=True)
        for kind, results in runs.items():
            parts = {p: float(np.mean([r["parts_s"][p] for r in results])) for p in results[0]["parts_s"]}
            record = {"benchmark": "auxiliary_throughput", "path": kind, "dataset_size": size_name,
                      "image_size": list(size), "megapixels": round(size[0] * size[1] / 1e6, 3),
                      "device": device.type, "device_name": device_name, "parts_s": parts,
                      "s_per_image": sum(parts.values()),
                      "s_per_image_each": [sum(r["parts_s"].values()) for r in results], "repeats": len(results),
                      "kept_masks": results[0]["kept_masks"], "kept_masks_target": args.kept_masks,
                      "kept_masks_source": KEPT_SOURCE, "segments_kept": results[0]["segments_kept"],
                      "load_avg_1min_each": [r["load_avg_1min"] for r in results],
                      "same_segments_as_today": None if kind == "today" else [
                          r["segments"] == t["segments"] for r, t in zip(results, runs["today"], strict=True)],
                      "prompt_batch": 128, "precision": "fp32",
                      "estimated_parts": ["image_encoder", "prompt_decoding", "match_encode"] if cpu else [],
                      "decode_overlapped_in_pipeline": kind == "new",
                      "commit": commit, "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
            with open(args.out, "a", encoding="utf-8") as handle_out:
                handle_out.write(json.dumps(record, sort_keys=True) + "\n")
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
