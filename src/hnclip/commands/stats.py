"""`hnclip stats`: caption geometry of a benchmark's test captions under the profile's initial
backbone (results/stats/<benchmark>.json), encoded on the profile's device in a GPU slot. Its
`example_batch` (paper Fig. A5) is one real training batch: the first micro-batch the seed-S
training loader yields on the benchmark's training set."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.io import write_json

TEXT_BATCH = 256
A5_BATCH = 8  # the paper's Fig. A5 shows B=8 captions of one training batch


def first_training_batch(n_train: int, micro_batch: int, seed: int, captions: int) -> list[int]:
    """Manifest rows of the first `captions` pairs of the first micro-batch a run on `n_train`
    training pairs yields: full training set, epoch 0, exactly the training loop's order. With
    `captions` <= `micro_batch` this is also the first batch a B=`captions` loader would yield
    (both cut the same permutation)."""
    from hnclip.data.loader import subset_indices
    from hnclip.training.batching import epoch_micro_batches
    batches = epoch_micro_batches(subset_indices(n_train, 1.0), micro_batch, seed, epoch=0)
    if not batches:
        raise ValueError(f"{n_train} training pairs is fewer than one micro-batch ({micro_batch})")
    return batches[0][:captions]


def _encode(model, tokenizer, captions: list[str], device):
    import torch

    from hnclip.models.towers import encode_text
    with torch.no_grad():
        return torch.cat([encode_text(model, tokenizer(captions[i:i + TEXT_BATCH]).to(device)).float().cpu()
                          for i in range(0, len(captions), TEXT_BATCH)])


def training_batch_geometry(features, rows: list, indices: list[int], train_set: str, seed: int,
                            micro_batch: int) -> dict:
    """Fig. A5's record: G of one training batch's caption features [B, D] (diagonal zeroed), its
    off-diagonal mean, and which manifest rows the batch holds."""
    import torch
    feats = torch.nn.functional.normalize(features.double(), dim=-1)
    g = feats @ feats.t()
    off = g[~torch.eye(len(indices), dtype=torch.bool)]
    return {"source": "train", "train_set": train_set, "seed": seed, "micro_batch": micro_batch, "epoch": 0,
            "indices": indices, "ids": [rows[i].id for i in indices], "G": g.fill_diagonal_(0.0).tolist(),
            "offdiag_mean": float(off.mean())}


def caption_statistics(reg: Registry, benchmark: str) -> Path:
    """Write and return results/stats/<benchmark>.json (with provenance)."""
    import torch

    from hnclip.data.manifest import read_manifest
    from hnclip.evaluation.caption_geometry import caption_geometry, length_statistics
    from hnclip.models.factory import backbone_pin, load_backbone
    from hnclip.runtime.device import compute_device
    from hnclip.runtime.gpu_slots import acquire_slot

    started = time.time()
    reg.test_manifest(benchmark)  # an unknown benchmark fails before the backbone is loaded
    name, spec = reg.backbone_name(), reg.backbone_spec()
    weights = paths.backbone_weights(name, spec["kind"], reg.profile["data_root"])
    backbone = load_backbone(spec["kind"], weights, spec["model_config"], backbone_pin(reg.profile, spec))
    manifest = reg.test_manifest(benchmark)
    captions = [row.caption for row in read_manifest(manifest)]
    train_set = reg.params["benchmarks"][benchmark]["train"]
    seed, micro_batch = reg.profile["seeds"][0], reg.profile["recipe"]["micro_batch"]
    train_manifest = reg.train_manifest(train_set)
    train_rows = read_manifest(train_manifest, check_images=False)
    batch = first_training_batch(len(train_rows), micro_batch, seed, A5_BATCH)
    torch.set_num_threads(reg.profile["execution"]["threads"])
    with acquire_slot():  # the GPU the SLURM/local profile booked for this job
        device = compute_device(reg.profile["execution"])
        model = backbone.model.to(device).eval()
        features = _encode(model, backbone.tokenizer, captions, device)
        batch_features = _encode(model, backbone.tokenizer, [train_rows[i].caption for i in batch], device)
    result = {"benchmark": benchmark, "backbone": name, **caption_geometry(features),
              "lengths": length_statistics(captions), "device": str(device)}
    result["example_batch"] = training_batch_geometry(batch_features, train_rows, batch, train_set, seed, micro_batch)
    result["provenance"] = provenance.record("stats", inputs={"test_manifest": manifest, "backbone": weights,
                                                              "train_manifest": train_manifest},
                                             wall_time_s=time.time() - started)
    out = paths.stats(benchmark)
    write_json(out, result)
    return out
