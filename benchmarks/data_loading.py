"""Decoding images into the model's input: images/s with 0, 2 and 4 loader worker processes.

    python benchmarks/data_loading.py [--images 300] [--repeats 3] [--workers 0,2,4]

Two cases, both through the training loop's own feed (`hnclip.training.feeding.group_batches`: micro-batches
of 16 index lists, `PairDataset.batch`, on the main process at 0 workers, else by a `LoadFeed`):

* real resolution: --images photographic-like JPEGs of 1,500 x 1,000 (smooth colour gradients and blobs,
  fine noise; quality 90; DOCCI's and DCI's images are of this size), preprocessed as Long-CLIP-L's
  (open_clip's eval transform at 224: bicubic resize, centre crop, OpenAI mean/std). One epoch's pass,
  uncached (`cache_images: false`): at this size the cache of a worker holds a fraction of a training set,
  so an epoch decodes nearly every image again. The time includes starting the workers, as a run's
  first epoch does.
* the embedded default (`tiny`): its own 64-px PNGs (a 512-pair synthetic DOCCI train split) and model
  config (hnclip-tiny-w128), a whole run's loading: 4 epochs, cached as that profile caches (the
  default budget), the workers' startup included. This is the number behind `loader_workers`'s default 0.

Each setting is measured --repeats times, the settings alternated within each repeat (so a drifting
shared machine affects all alike); the record gives each setting's median images/s and the raw values.
The main process runs torch with one thread, as the embedded default's jobs do; each worker has one.
One JSON line is appended to benchmarks/results/data_loading.jsonl.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "data_loading.jsonl"
REAL_SIZE = (1500, 1000)   # width x height
MICRO_BATCH = 16
TINY_EPOCHS, TINY_TRAIN, TINY_CONFIG = 4, 512, "hnclip-tiny-w128"


def photo_like(rng: np.random.Generator, size: tuple[int, int] = REAL_SIZE) -> Image.Image:
    """Smooth gradients and soft blobs (what JPEG compresses well) with fine noise (what it does not)."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([(x / width) * rng.uniform(60, 200) + (y / height) * rng.uniform(0, 80) for _ in range(3)], -1)
    blobs = rng.uniform(0, 255, (height // 100 + 1, width // 100 + 1, 3)).astype(np.uint8)
    base += np.asarray(Image.fromarray(blobs).resize((width, height), Image.BICUBIC), np.float32) * 0.6
    base += rng.normal(0, 10, (height, width, 3))
    return Image.fromarray(np.clip(base * 0.7, 0, 255).astype(np.uint8))


def write_real_images(folder: Path, n: int, seed: int = 0) -> Path:
    from hnclip.data.manifest import ManifestRow, write_manifest
    rng = np.random.default_rng(seed)
    (folder / "images").mkdir(parents=True)
    rows = []
    for i in range(n):
        name = f"images/{i:05d}.jpg"
        photo_like(rng).save(folder / name, quality=90)
        rows.append(ManifestRow(f"img{i:05d}", name, f"a photograph, number {i}", None, "train", "0" * 64))
    write_manifest(folder / "train.jsonl", rows)
    return folder / "train.jsonl"


def _run(data, workers: int, epochs: int, device: str = "cpu"):
    """What `group_batches` reads of the training loop's run, for plain image-caption pairs."""
    from hnclip.training.feeding import MicroBatchFeed
    from hnclip.training.methods import Method
    run = SimpleNamespace(method=Method("full", data.batch, None), device=torch.device(device),
                          recipe={"micro_batch": MICRO_BATCH, "grad_accum": 1, "epochs": epochs},
                          job=SimpleNamespace(spec={"seed": 0}), feed=None,
                          indices=list(range(len(data))), distributed=SimpleNamespace(local_slice=lambda ix: ix))
    if workers:
        run.feed = MicroBatchFeed(run, workers)
    return run


def loading_seconds(data, workers: int, epochs: int) -> float:
    """Seconds to hand `epochs` epochs of micro-batches to the loop, as `hnclip.training.loop` asks for them."""
    from hnclip.training.batching import accumulation_groups, epoch_micro_batches
    from hnclip.training.feeding import group_batches
    run = _run(data, workers, epochs)
    started = time.perf_counter()
    for epoch in range(epochs):
        groups = accumulation_groups(epoch_micro_batches(run.indices, MICRO_BATCH, 0, epoch), 1)
        for index, group in enumerate(groups):
            group_batches(run, epoch, index, group)
    if run.feed is not None:
        run.feed.close()
    return time.perf_counter() - started


def alternated(make_data, settings: list[int], repeats: int, epochs: int) -> dict:
    """images/s of each worker setting: --repeats rounds, each measuring every setting once, in rotated order."""
    rates: dict[int, list[float]] = {w: [] for w in settings}
    for repeat in range(repeats):
        order = settings[repeat % len(settings):] + settings[:repeat % len(settings)]
        for workers in order:
            data = make_data()   # a fresh dataset: an empty cache
            images = epochs * (len(data) // MICRO_BATCH) * MICRO_BATCH
            rates[workers].append(round(images / loading_seconds(data, workers, epochs), 1))
    return {str(w): {"images_per_s": statistics.median(r), "runs": r} for w, r in rates.items()}


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from command1_costs import _commit, append_record, utc_now
    from open_clip.transform import image_transform

    from hnclip.data.loader import DEFAULT_IMAGE_CACHE_MB, PairDataset
    from hnclip.data.synthetic import write_dataset
    from hnclip.models.factory import create

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="real-resolution JPEGs to generate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="0,2,4", help="worker counts for the real-resolution case")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = [int(w) for w in args.workers.split(",")]
    with contextlib.redirect_stderr(sys.stdout):   # open_clip's "no pretrained weights" warning
        tiny = create(TINY_CONFIG)
    preprocess_224 = image_transform(224, is_train=False)   # Long-CLIP-L's (hnclip.models.longclip)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        real = write_real_images(root / "real", args.images)
        generated_s = time.perf_counter() - started
        jpeg_kb = statistics.median(p.stat().st_size for p in (root / "real" / "images").iterdir()) / 1024
        tiny_manifest = write_dataset(root / "docci", "docci", {"train": TINY_TRAIN}, seed=0,
                                      generator={"style": "simple", "family_size": 2})["train"]
        real_rates = alternated(lambda: PairDataset.from_manifest(real, preprocess_224, tiny.tokenizer, False),
                                settings, args.repeats, epochs=1)
        tiny_rates = alternated(lambda: PairDataset.from_manifest(tiny_manifest, tiny.preprocess, tiny.tokenizer),
                                [0, 2], args.repeats, epochs=TINY_EPOCHS)
    faster = max(tiny_rates, key=lambda w: tiny_rates[w]["images_per_s"])
    return append_record(args.out, {
        "benchmark": "data_loading", "timestamp": utc_now(), "commit": _commit(ROOT),
        "cpus": len(os.sched_getaffinity(0)), "main_threads": 1, "repeats": args.repeats,
        "micro_batch": MICRO_BATCH,
        "real": {"images": args.images, "size": list(REAL_SIZE), "jpeg_quality": 90, "median_jpeg_kb": round(jpeg_kb),
                 "input_px": 224, "cached": False, "epochs": 1, "generated_s": round(generated_s, 1),
                 "workers": real_rates},
        "tiny": {"images": TINY_TRAIN, "model_config": TINY_CONFIG, "input_px": 64, "epochs": TINY_EPOCHS,
                 "cache_mb": DEFAULT_IMAGE_CACHE_MB, "workers": tiny_rates, "faster_workers": int(faster)}})


if __name__ == "__main__":
    main()
