"""The size of the model a profile trains, counted from its open_clip config without importing torch:
`hnclip plan` turns it into checkpoint disk and host memory."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from hnclip.config.constants import CONTEXT_LENGTH, DEFAULT_ADAPTER
from hnclip.errors import UserError


def model_config(name: str) -> dict:
    """An open_clip model config: this package's (hnclip/models/configs) or open_clip's own, read
    without importing torch."""
    folders = [Path(importlib.util.find_spec("hnclip.models").origin).parent / "configs"]
    spec = importlib.util.find_spec("open_clip")
    if spec and spec.submodule_search_locations:
        folders.append(Path(next(iter(spec.submodule_search_locations))) / "model_configs")
    for folder in folders:
        if (folder / f"{name}.json").is_file():
            return json.loads((folder / f"{name}.json").read_text())
    raise UserError(f"model config {name!r} not found in {[str(f) for f in folders]}")


def _block_parameters(width: int, hidden: int) -> int:
    """One open_clip residual block: attention (in_proj, out_proj), MLP (c_fc, c_proj), two LayerNorms."""
    return 4 * width * width + 4 * width + 2 * width * hidden + hidden + width + 4 * width


def clip_parameters(cfg: dict, context_length: int = CONTEXT_LENGTH) -> int:
    """Parameters of an open_clip CLIP (ViT image tower, transformer text tower) at Long-CLIP's context."""
    vision, embed = cfg["vision_cfg"], cfg["embed_dim"]
    width, tokens = vision["width"], (vision["image_size"] // vision["patch_size"]) ** 2 + 1
    hidden = int(width * vision.get("mlp_ratio", 4.0))
    image_tower = (3 * vision["patch_size"] ** 2 * width + width + tokens * width + 4 * width
                   + vision["layers"] * _block_parameters(width, hidden) + width * embed)
    return image_tower + text_tower_parameters(cfg, context_length) + 1  # + the logit scale


def text_tower_parameters(cfg: dict, context_length: int = CONTEXT_LENGTH) -> int:
    """The text tower's parameters: embeddings, blocks, final LayerNorm and projection."""
    text, embed = cfg["text_cfg"], cfg["embed_dim"]
    width = text["width"]
    hidden = int(width * text.get("mlp_ratio", 4.0))
    return ((text["vocab_size"] + context_length) * width + 2 * width
            + text["layers"] * _block_parameters(width, hidden) + width * embed)


def adapter_parameters(cfg: dict, kind: str, r: int = DEFAULT_ADAPTER["r"]) -> int:
    """LoRA/DoRA parameters on q, k, v, out and both MLP projections of every block of both towers
    (hnclip.models.adapters); DoRA adds one magnitude per output feature."""
    total = 0
    for tower in (cfg["vision_cfg"], cfg["text_cfg"]):
        width = tower["width"]
        hidden = int(width * tower.get("mlp_ratio", 4.0))
        lora = 4 * r * 2 * width + 2 * r * (width + hidden)
        total += tower["layers"] * (lora + (5 * width + hidden if kind == "dora" else 0))
    return total
