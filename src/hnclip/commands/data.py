"""`hnclip data`: materialise a dataset role as manifests, generated (embedded profile) or
downloaded and converted (paper profile). The command of one concept at two layers: the datasets
themselves (generators, builders, manifests) are the package `hnclip.data`."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.constants import PRETRAIN_ROLE
from hnclip.config.registry import Registry, pretrain_dataset
from hnclip.errors import UnknownNameError
from hnclip.io import write_json


def dataset_generation(reg: Registry, role: str) -> dict:
    """What `hnclip data` must produce for a dataset role (or the pretraining corpus)."""
    if role == PRETRAIN_ROLE:
        return pretrain_dataset(reg.backbone_spec()["pretrain"])
    if role not in reg.profile["datasets"]:
        raise UnknownNameError(f"unknown dataset role {role!r}; allowed values: "
                               f"{sorted([*reg.profile['datasets'], PRETRAIN_ROLE])}")
    return reg.profile["datasets"][role]


def build_dataset(reg: Registry, role: str) -> dict[str, Path]:
    """Write the role's manifests and `dataset.json`; returns split -> manifest path."""
    spec = dataset_generation(reg, role)
    data_root = Path(reg.profile["data_root"])
    out_dir = paths.dataset_dir(data_root, role)
    started = time.time()
    if spec["kind"] == "synthetic":
        from hnclip.data.synthetic import dataset_fingerprint, write_dataset
        generator = spec.get("generator")
        manifests = write_dataset(out_dir, spec["variant"], spec["sizes"], spec["seed"], generator=generator)
        extra = {"generator": dataset_fingerprint(spec["variant"], spec["sizes"], spec["seed"], generator=generator)}
    else:
        from hnclip.data.download import download_dataset
        from hnclip.data.real import BUILDERS
        from hnclip.data.source_tables import profile_source
        # verifies against the profile's table; a no-op when already verified
        download_dataset(spec["source"], data_root, source=profile_source(reg.profile, spec["source"]))
        report = BUILDERS[role](data_root / spec["source"], out_dir, **spec.get("protocol", {}))
        manifests = report.manifests
        extra = {"counts": report.counts, "paper_count_mismatches": report.mismatches(),
                 "fraction_over_248_tokens": report.over_context, "notes": report.notes}
        for line in report.mismatches():
            print(f"count differs from paper Table A1: {line}")
    record = provenance.record("dataset", spec=spec, wall_time_s=time.time() - started,
                               inputs={f"manifest:{k}": v for k, v in manifests.items()}, extra=extra)
    write_json(out_dir / "dataset.json", record)
    return manifests
