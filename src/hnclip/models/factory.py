"""open_clip model construction for both profiles, and the backbone weights a run starts from."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import open_clip
import torch

from hnclip.config.constants import CONTEXT_LENGTH

CONFIG_DIR = Path(__file__).parent / "configs"
_registered = False


def register_configs() -> None:
    """Make our model configs (e.g. `hnclip-tiny`) known to open_clip's factory; no network."""
    global _registered
    if not _registered:
        for cfg in sorted(CONFIG_DIR.glob("*.json")):
            open_clip.add_model_config(cfg)
        _registered = True


@dataclass
class Backbone:
    model: torch.nn.Module
    preprocess: Any   # PIL image -> tensor, open_clip's eval transform
    tokenizer: Any    # list[str] -> LongTensor [N, 248]


def create(model_config: str) -> Backbone:
    register_configs()
    model, _, preprocess = open_clip.create_model_and_transforms(
        model_config, pretrained=None, force_context_length=CONTEXT_LENGTH)
    tokenizer = open_clip.get_tokenizer(model_config, context_length=CONTEXT_LENGTH)
    return Backbone(model.float(), preprocess, tokenizer)


def save_weights(model: torch.nn.Module, model_config: str, path: str | Path) -> None:
    from hnclip.io import atomic_path
    with atomic_path(path) as tmp:
        torch.save({"model_config": model_config, "state_dict": model.state_dict()}, tmp)


def load_weights(path: str | Path) -> Backbone:
    """Load a checkpoint written by `save_weights` strictly (any key mismatch is an error)."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    backbone = create(payload["model_config"])
    backbone.model.load_state_dict(payload["state_dict"], strict=True)
    return backbone


def backbone_pin(profile: Mapping, spec: Mapping) -> str | None:
    """The sha256 the profile's source table pins a downloaded backbone's weights to (None: a backbone
    pretrained here). The rehearsal profile's table pins its own Long-CLIP-layout checkpoint."""
    if spec["kind"] != "longclip":
        return None
    from hnclip.config import paths
    from hnclip.data.source_tables import pinned_weights_sha256
    weights = paths.backbone_weights("", spec["kind"], profile["data_root"])
    return pinned_weights_sha256(profile, spec["source"], weights.name)


def load_backbone(kind: str, path: str | Path, model_config: str, expected_sha256: str | None = None) -> Backbone:
    """The initial weights of a run. A Long-CLIP checkpoint must have `expected_sha256` (None: the
    Long-CLIP-L release's pin); give it `backbone_pin(profile, spec)`, the pin of the profile's table."""
    if kind == "longclip":
        from hnclip.models.longclip import (  # the real Long-CLIP-L checkpoint (paper profile)
            LONGCLIP_L_SHA256,
            load_longclip,
        )
        loaded = load_longclip(path, expected_sha256=expected_sha256 or LONGCLIP_L_SHA256)
        return Backbone(loaded.model, loaded.preprocess, loaded.tokenizer)
    if kind == "scratch":
        return create(model_config)
    return load_weights(path)
