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
<kind>.jsonl.shards/ when rerun (see hnclip.auxiliary.shards). Several jobs can share a build:
`--shard K` makes shard K only (items [K*n, (K+1)*n), n = `auxiliary.shard_images`, default 256) into
<kind>.jsonl.shards/shard-KKKKK.jsonl and writes nothing else; `--gather` writes <kind>.jsonl and
record.json from the shards, byte-identical to a single job's; `shard_count` says how many there are.
"""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.auxiliary.shards import DEFAULT_SHARD_ITEMS, shard_count
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


def shard_items(reg: Registry) -> int:
    """Images per shard of the auxiliary builds (`auxiliary.shard_images`, else 256)."""
    return int(reg.profile["auxiliary"].get("shard_images", DEFAULT_SHARD_ITEMS))


def auxiliary_shard_count(reg: Registry, dataset: str, kind: str) -> int:
    """How many shards a build of one auxiliary input has (a workflow's scatter over `--shard K`)."""
    from hnclip.data.manifest import read_manifest
    if kind not in KINDS:
        raise UnknownNameError(f"unknown auxiliary input {kind!r}; allowed values: {list(KINDS)}")
    return shard_count(len(read_manifest(reg.train_manifest(dataset))), shard_items(reg))


def build_auxiliary(reg: Registry, dataset: str, kind: str, shard: int | None = None, gather: bool = False) -> Path:
    """Build one auxiliary input of a training set; returns its JSONL index (with `shard`: the shard's
    resume file, and nothing else is written; with `gather`: the index from the existing shards)."""
    if kind not in KINDS:
        raise UnknownNameError(f"unknown auxiliary input {kind!r}; allowed values: {list(KINDS)}")
    if shard is not None and gather:
        raise ValueError("--shard and --gather exclude each other")
    started = time.time()
    data_root, settings = reg.profile["data_root"], reg.profile["auxiliary"]
    manifest = reg.train_manifest(dataset)
    out_dir = paths.auxiliary_dir(data_root, dataset, kind)
    inputs = {"train_manifest": manifest}
    split = {"shard_images": shard_items(reg), "only_shard": shard, "gather": gather}
    if kind == "segments":
        summary = _segments(reg, manifest, out_dir, split)
        inputs.update({f"model:{k}": v for k, v in model_inputs(reg).items()})
    else:
        from hnclip.auxiliary.edges import EdgeSettings, build_edges
        segments = paths.auxiliary_index(data_root, dataset, "segments")
        summary = build_edges(manifest, segments, out_dir, EdgeSettings(**settings["edges"]), **split)
        inputs["segments"] = segments
    index = paths.auxiliary_index(data_root, dataset, kind)
    if shard is not None:
        from hnclip.auxiliary.shards import shard_path
        return shard_path(paths.shard_dir(index), shard)
    inputs[kind] = index
    record = provenance.record(f"auxiliary:{kind}", inputs=inputs, wall_time_s=time.time() - started,
                               params={"auxiliary": settings}, extra={"dataset": dataset, "summary": summary})
    write_json(record_path(reg, dataset, kind), record)
    return index


def _segments(reg: Registry, manifest: Path, out_dir: Path, split: dict) -> dict:
    import torch

    from hnclip.auxiliary.lism import LismSettings, backbone_encoders, build_lism, hf_clip_encoders
    from hnclip.runtime.device import compute_device
    from hnclip.runtime.gpu_slots import acquire_slot

    settings, data_root = reg.profile["auxiliary"], reg.profile["data_root"]
    models = {name: file_sha256(path) for name, path in model_inputs(reg).items()}
    if split["gather"]:   # the shards' identity needs the models' names and files, not the models
        segmenter, encoders = _named_only(settings, data_root)
        return build_lism(manifest, out_dir, segmenter, encoders, LismSettings(**settings["lism"]),
                          fingerprint={"models": models}, **split)
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
        # the model files' content, beyond their paths: a shard made with other weights is not resumed
        # from (the SAM and CLIP directories' files are in the segmenter's and matcher's fingerprints)
        return build_lism(manifest, out_dir, segmenter, encoders, LismSettings(**settings["lism"]),
                          fingerprint={"models": models}, **split)


def _named_only(settings: dict, data_root: str):
    """A segmenter and matcher that only name themselves as `_segmenter` and the matchers of `_segments`
    do (for a gather, which makes no rows)."""
    from types import SimpleNamespace

    from hnclip.auxiliary.lism import Encoders
    from hnclip.auxiliary.segments import CpuSegmenter, directory_sha256, sam_fingerprint

    def unused(*args):
        raise RuntimeError("a gather makes no rows")

    segmenter_settings = settings["segmenter"]
    if segmenter_settings["kind"] == "cpu":
        segmenter = CpuSegmenter()
    else:
        dtype = "fp32" if segmenter_settings.get("implementation", "direct") == "pipeline" else \
            segmenter_settings.get("dtype", "fp32")
        fingerprint = sam_fingerprint(_downloaded(data_root, segmenter_settings["source"]),
                                      points_per_batch=segmenter_settings.get("points_per_batch", 128), dtype=dtype)
        segmenter = SimpleNamespace(fingerprint=lambda: fingerprint, masks=unused)
    if settings["matcher"]["kind"] == "backbone":
        encoders = Encoders(unused, unused, unused, 0, "backbone")
    else:
        model = _downloaded(data_root, settings["matcher"]["source"])
        encoders = Encoders(unused, unused, unused, 0, f"hf-clip:{model}",
                            fingerprint={"files": directory_sha256(model)})
    return segmenter, encoders


def _segmenter(settings: dict, data_root: str, device: str):
    from hnclip.auxiliary.segments import CpuSegmenter, SamSegmenter
    if settings["kind"] == "cpu":
        return CpuSegmenter()
    model, batch = _downloaded(data_root, settings["source"]), settings.get("points_per_batch", 128)
    if settings.get("implementation", "direct") == "pipeline":   # transformers' pipeline, as released
        return SamSegmenter(model, points_per_batch=batch, device=device)
    from hnclip.auxiliary.sam_masks import DirectSamSegmenter
    return DirectSamSegmenter(model, points_per_batch=batch, device=device, dtype=settings.get("dtype", "fp32"))


def _downloaded(data_root: str, source: str) -> Path:
    """The directory of a verified model download (`hnclip download <source>`)."""
    return Path(data_root) / source / "raw"
