"""StructXLIP's structure inputs: a Canny edge map per image and edge crops of its top-K segments.

The release ships neither the edge script nor its parameters (README "Release Status"; the paper
says Canny-type maps). Choices here, all `EdgeSettings`:
  - Canny on the grayscale image (cv2.Canny, 3x3 Sobel, L1 gradient), optional Gaussian blur first;
  - thresholds "fixed" (low, high) or "median": (1 - sigma)*median, (1 + sigma)*median of the
    grayscale image, clipped to [0, 255] (the common automatic rule; sigma 0.33 gives ~0.67/1.33).
    For the 64x64 synthetic scenes the default is fixed (100, 200) without blur: it outlines every
    flat shape and its texture, while the noisy backgrounds (asphalt, grain, +-28 levels) stay
    mostly blank; the median rule puts their noise into the map. For photos we suggest "median"
    with a 3-px blur; the paper-scale thresholds are unknown.
  - edge crops: the edge map cut to the bbox of the top-K (K = 2) entries of the LISM row's ranked
    `matches` (GOAL keeps one segment, StructXLIP needs K); with `distinct_crops` a crop matched by
    several sentences counts once. Fewer than K matches give fewer crops; StructXLIP's loader pads
    the missing ones with black dummies marked invalid.
Edge PNGs are 'L' mode, 0 or 255. Paths in edges.jsonl are relative to its directory. Like the
segments, the build is sharded and resumable (`hnclip.auxiliary.shards`).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from hnclip.auxiliary.lism import crop_name, file_stem
from hnclip.auxiliary.shards import DEFAULT_SHARD_ITEMS, build_sharded
from hnclip.data.manifest import read_manifest
from hnclip.hashing import file_sha256
from hnclip.io import atomic_path, read_jsonl

THRESHOLD_MODES = ("fixed", "median")


@dataclass(frozen=True)
class EdgeSettings:
    thresholds: str = "fixed"   # or "median"
    low: float = 100.0          # fixed mode
    high: float = 200.0
    sigma: float = 0.33         # median mode
    blur_px: int = 0            # Gaussian kernel size before Canny; 0 = none
    top_k: int = 2
    distinct_crops: bool = True

    def __post_init__(self) -> None:
        if self.thresholds not in THRESHOLD_MODES:
            raise ValueError(f"thresholds must be one of {THRESHOLD_MODES}, got {self.thresholds!r}")
        if self.blur_px and self.blur_px % 2 == 0:
            raise ValueError(f"blur_px must be 0 or odd, got {self.blur_px}")


def canny_thresholds(gray: np.ndarray, settings: EdgeSettings) -> tuple[float, float]:
    if settings.thresholds == "fixed":
        return settings.low, settings.high
    median = float(np.median(gray))
    return max(0.0, (1.0 - settings.sigma) * median), min(255.0, (1.0 + settings.sigma) * median)


def edge_map(image: Image.Image, settings: EdgeSettings) -> np.ndarray:
    """uint8 [H, W] Canny edges (255 on an edge, else 0) of the image's grayscale."""
    gray = np.asarray(image.convert("L"))
    if settings.blur_px:
        gray = cv2.GaussianBlur(gray, (settings.blur_px, settings.blur_px), 0)
    low, high = canny_thresholds(gray, settings)
    return cv2.Canny(np.ascontiguousarray(gray), low, high)


def top_matches(matches: list[dict], top_k: int, distinct_crops: bool) -> list[dict]:
    """The first top_k entries of a ranked match list, skipping repeated crops if distinct_crops."""
    chosen, seen = [], set()
    for entry in matches:
        if distinct_crops and crop_name(entry) in seen:
            continue
        seen.add(crop_name(entry))
        chosen.append(entry)
        if len(chosen) == top_k:
            break
    return chosen


def _write_edges(edges: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp:
        Image.fromarray(edges).save(tmp, format="PNG")


def build_edges(manifest_path: str | Path, segments_jsonl: str | Path, out_dir: str | Path,
                settings: EdgeSettings = EdgeSettings(), *, shard_images: int = DEFAULT_SHARD_ITEMS,
                only_shard: int | None = None, gather: bool = False) -> dict:
    """Write out_dir/edges/<id>.png, out_dir/edge_crops/*.png and out_dir/edges.jsonl
    ({id, edge_file, crops: [{edge_crop_file, bbox, similarity, sentence}]}), in resumable shards of
    `shard_images` images (`only_shard`, `gather`: see `build_sharded`); returns a summary."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    lism = {row["id"]: row for row in read_jsonl(segments_jsonl)}
    items = read_manifest(manifest_path)
    missing = [item.id for item in items if item.id not in lism]
    if missing:
        raise KeyError(f"{segments_jsonl} has no row for {len(missing)} image(s) of {manifest_path} "
                       f"(e.g. {missing[:3]}); rebuild the segments first")
    identity = {"step": "edges", "manifest_sha256": file_sha256(manifest_path),
                "segments_sha256": file_sha256(segments_jsonl), "settings": asdict(settings)}
    rows, shards = build_sharded(items, lambda batch: [_edge_row(item, lism[item.id], out_dir, settings)
                                                       for item in batch],
                                 out_dir / "edges.jsonl", identity, shard_items=shard_images, desc="edges",
                                 only_shard=only_shard, gather=gather,
                                 files_of=lambda row: [row["edge_file"], *(c["edge_crop_file"] for c in row["crops"])])
    crop_counts = [len(row["crops"]) for row in rows]
    return {"images": len(rows), "edge_crops": int(sum(crop_counts)),
            "images_with_top_k": sum(n == settings.top_k for n in crop_counts),
            "wall_s": time.perf_counter() - start, **shards, "settings": asdict(settings)}


def _edge_row(item, lism_row: dict, out_dir: Path, settings: EdgeSettings) -> dict:
    """One image's edges.jsonl row; writes its edge map and the edge crops of its top matches."""
    with Image.open(item.image) as opened:
        edges = edge_map(opened, settings)
    edge_file = f"edges/{file_stem(item.id)}.png"
    _write_edges(edges, out_dir / edge_file)
    crops = []
    for entry in top_matches(lism_row["matches"], settings.top_k, settings.distinct_crops):
        box = entry["bbox"]
        crop_file = f"edge_crops/{crop_name(entry)}.png"
        _write_edges(edges[box["y1"]:box["y2"], box["x1"]:box["x2"]], out_dir / crop_file)
        crops.append({"edge_crop_file": crop_file, "bbox": box, "similarity": entry["similarity"],
                      "sentence": entry["sentence"]})
    return {"id": item.id, "edge_file": edge_file, "crops": crops}
