"""`hnclip image-cache`: a dataset's images decoded once, at the profile backbone's input size, as uint8
arrays that every training and evaluation job of the profile memory-maps (`execution.image_cache`;
`hnclip.data.image_cache`)."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.errors import UnknownNameError
from hnclip.io import read_json, write_json


def marker_path(data_root: str | Path, dataset: str) -> Path:
    """The workflow's output of one dataset's cache: the records of all its splits."""
    return paths.dataset_dir(data_root, dataset) / "image_cache" / "image_cache.json"


def dataset_manifests(reg: Registry, dataset: str) -> dict[str, Path]:
    """split -> manifest of a dataset role, as its dataset.json names them."""
    record = read_json(paths.dataset_dir(reg.profile["data_root"], dataset) / "dataset.json")
    return {name.split(":", 1)[1]: Path(entry["path"]) for name, entry in record["inputs"].items()
            if name.startswith("manifest:")}


def backbone_preprocess(reg: Registry):
    """The eval transform the profile's runs apply (`hnclip.models.factory`, `hnclip.models.longclip`),
    without loading weights: a released Long-CLIP's is open_clip's default at its config's image size."""
    from open_clip.transform import image_transform

    from hnclip.models.factory import create, register_configs
    spec = reg.backbone_spec()
    if spec["kind"] != "longclip":
        return create(spec["model_config"]).preprocess
    import open_clip
    register_configs()
    return image_transform(open_clip.get_model_config(spec["model_config"])["vision_cfg"]["image_size"],
                           is_train=False)


def build_image_cache(reg: Registry, dataset: str, splits: list[str] | None = None) -> Path:
    """Write the image cache of `splits` (default: all) of a dataset role and the dataset's marker."""
    from hnclip.data.image_cache import PixelTransform, record_path, write_image_cache
    manifests = dataset_manifests(reg, dataset)
    unknown = sorted(set(splits or []) - set(manifests))
    if unknown:
        raise UnknownNameError(f"{dataset} has no split {unknown}; allowed values: {sorted(manifests)}")
    transform = PixelTransform.from_preprocess(backbone_preprocess(reg))
    started = time.time()
    written = {}
    for split in splits or sorted(manifests):
        fields = provenance.record("image_cache", inputs={"manifest": manifests[split]},
                                   extra={"dataset": dataset, "split": split,
                                          "backbone": reg.backbone_spec()["model_config"]})
        written[split] = write_image_cache(manifests[split], transform, fields, reg.profile["execution"]["threads"])
        print(f"{dataset}/{split}: {read_json(written[split])['shape']} uint8 in {written[split].parent}")
    every = {split: record_path(manifest) for split, manifest in manifests.items() if record_path(manifest).is_file()}
    marker = marker_path(reg.profile["data_root"], dataset)
    write_json(marker, provenance.record("image_cache", inputs={f"image_cache:{s}": p for s, p in every.items()},
                                         wall_time_s=time.time() - started,
                                         extra={"dataset": dataset, "transform": transform.settings()}))
    return marker
