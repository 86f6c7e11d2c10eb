"""`hnclip auxiliary`: a training set's auxiliary inputs for the baselines, each its own rule. The command
of one concept at two layers: the builders themselves are the package `hnclip.auxiliary`.

segments: GOAL's LISM pairs (segment masks -> crops, sentences matched to crops by a CLIP
          encoder); StructXLIP reads their ranked matches too.
edges:    StructXLIP's Canny edge maps of each image and of its top-K matched segments.
The segmenter and matcher are the profile's (`profiles.<p>.auxiliary`): in the embedded profile a
CPU colour-region segmenter and the pretrained tiny backbone; in the paper profile SAM ViT-H and
CLIP ViT-L/14-336 through transformers, from pinned downloads. Each writes its files under
<data_root>/<dataset>/auxiliary/<kind>/ and a provenance record beside them. Both builds are
sharded: a job killed part-way (SLURM time limit, preemption) resumes from the shards in
<kind>.jsonl.shards/ when rerun (see hnclip.auxiliary.shards).
"""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.errors import UnknownNameError
from hnclip.hashing import file_sha256
from hnclip.io import write_json

KINDS = ("segments", "edges")


def record_path(reg: Registry, dataset: str, kind: str) -> Path:
    return paths.auxiliary_dir(reg.profile["data_root"], dataset, kind) / "record.json"


def model_inputs(reg: Registry) -> dict[str, Path]:
    """The model files the segments step reads (the tiny backbone, or the downloaded SAM / CLIP)."""
    settings, data_root = reg.profile["auxiliary"], reg.profile["data_root"]
    inputs = {}
    if settings["matcher"]["kind"] == "backbone":
        spec = reg.backbone_spec()
        inputs["matcher"] = paths.backbone_weights(reg.backbone_name(), spec["kind"], data_root)
    else:
        inputs["matcher"] = paths.download_record(data_root, settings["matcher"]["source"])
    if settings["segmenter"]["kind"] == "sam":
        inputs["segmenter"] = paths.download_record(data_root, settings["segmenter"]["source"])
    return inputs


def build_auxiliary(reg: Registry, dataset: str, kind: str) -> Path:
    """Build one auxiliary input of a training set; returns its JSONL index."""
    if kind not in KINDS:
        raise UnknownNameError(f"unknown auxiliary input {kind!r}; allowed values: {list(KINDS)}")
    started = time.time()
    data_root, settings = reg.profile["data_root"], reg.profile["auxiliary"]
    manifest = reg.train_manifest(dataset)
    out_dir = paths.auxiliary_dir(data_root, dataset, kind)
    inputs = {"train_manifest": manifest}
    if kind == "segments":
        summary = _segments(reg, manifest, out_dir)
        inputs.update({f"model:{k}": v for k, v in model_inputs(reg).items()})
    else:
        from hnclip.auxiliary.edges import EdgeSettings, build_edges
        segments = paths.auxiliary_index(data_root, dataset, "segments")
        summary = build_edges(manifest, segments, out_dir, EdgeSettings(**settings["edges"]))
        inputs["segments"] = segments
    index = paths.auxiliary_index(data_root, dataset, kind)
    inputs[kind] = index
    record = provenance.record(f"auxiliary:{kind}", inputs=inputs, wall_time_s=time.time() - started,
                               params={"auxiliary": settings}, extra={"dataset": dataset, "summary": summary})
    write_json(record_path(reg, dataset, kind), record)
    return index


def _segments(reg: Registry, manifest: Path, out_dir: Path) -> dict:
    import torch

    from hnclip.auxiliary.lism import LismSettings, backbone_encoders, build_lism, hf_clip_encoders
    from hnclip.runtime.device import compute_device
    from hnclip.runtime.gpu_slots import acquire_slot

    settings, data_root = reg.profile["auxiliary"], reg.profile["data_root"]
    torch.set_num_threads(reg.profile["execution"]["threads"])
    with acquire_slot():
        device = str(compute_device(reg.profile["execution"]))
        segmenter = _segmenter(settings["segmenter"], data_root, device)
        if settings["matcher"]["kind"] == "backbone":
            from hnclip.models.factory import backbone_pin, load_backbone
            spec = reg.backbone_spec()
            weights = paths.backbone_weights(reg.backbone_name(), spec["kind"], data_root)
            backbone = load_backbone(spec["kind"], weights, spec["model_config"], backbone_pin(reg.profile, spec))
            backbone.model.to(device)
            encoders = backbone_encoders(backbone, device=device)
        else:
            encoders = hf_clip_encoders(_downloaded(data_root, settings["matcher"]["source"]), device=device)
        # the model files' content, beyond their paths: a shard made with other weights is not resumed from
        models = {name: file_sha256(path) for name, path in model_inputs(reg).items()}
        return build_lism(manifest, out_dir, segmenter, encoders, LismSettings(**settings["lism"]),
                          fingerprint={"models": models})


def _segmenter(settings: dict, data_root: str, device: str):
    from hnclip.auxiliary.segments import CpuSegmenter, SamSegmenter
    if settings["kind"] == "cpu":
        return CpuSegmenter()
    return SamSegmenter(_downloaded(data_root, settings["source"]),
                        points_per_batch=settings.get("points_per_batch", 128), device=device)


def _downloaded(data_root: str, source: str) -> Path:
    """The directory of a verified model download (`hnclip download <source>`)."""
    return Path(data_root) / source / "raw"
