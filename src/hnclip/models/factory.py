"""open_clip model construction for both profiles, and the backbone weights a run starts from."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def load_backbone(kind: str, path: str | Path, model_config: str) -> Backbone:
    if kind == "longclip":
        from hnclip.models.longclip import (
            load_longclip,  # the real Long-CLIP-L checkpoint (paper profile)
        )
        loaded = load_longclip(path)
        return Backbone(loaded.model, loaded.preprocess, loaded.tokenizer)
    if kind == "scratch":
        return create(model_config)
    return load_weights(path)
