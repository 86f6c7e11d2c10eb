"""`hnclip stats`: caption geometry of a benchmark's test captions under the profile's initial
backbone (results/stats/<benchmark>.json), encoded on the profile's device in a GPU slot."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.io import write_json

TEXT_BATCH = 256


def caption_statistics(reg: Registry, benchmark: str) -> Path:
    """Write and return results/stats/<benchmark>.json (with provenance)."""
    import torch

    from hnclip.data.manifest import read_manifest
    from hnclip.evaluation.caption_geometry import caption_geometry, length_statistics
    from hnclip.models.factory import load_backbone
    from hnclip.models.towers import encode_text
    from hnclip.runtime.device import resolve_device
    from hnclip.runtime.gpu_slots import acquire_slot

    started = time.time()
    name, spec = reg.backbone_name(), reg.backbone_spec()
    weights = paths.backbone_weights(name, spec["kind"], reg.profile["data_root"])
    backbone = load_backbone(spec["kind"], weights, spec["model_config"])
    manifest = reg.test_manifest(benchmark)
    captions = [row.caption for row in read_manifest(manifest)]
    torch.set_num_threads(reg.profile["execution"]["threads"])
    with acquire_slot():  # the GPU the SLURM/local profile booked for this job
        device = resolve_device(reg.profile["execution"]["device"])
        model = backbone.model.to(device).eval()
        with torch.no_grad():
            features = torch.cat([encode_text(model, backbone.tokenizer(captions[i:i + TEXT_BATCH]).to(device))
                                  .float().cpu() for i in range(0, len(captions), TEXT_BATCH)])
    result = {"benchmark": benchmark, "backbone": name, **caption_geometry(features),
              "lengths": length_statistics(captions), "device": str(device)}
    result["provenance"] = provenance.record("stats", inputs={"test_manifest": manifest, "backbone": weights},
                                             wall_time_s=time.time() - started)
    out = paths.stats(benchmark)
    write_json(out, result)
    return out
