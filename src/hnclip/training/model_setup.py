"""The model a run starts from: initial weights, logit scale reset, the framework's wrapping, and the
frozen text tower of a frozen-G run; and the precision it trains in."""
from __future__ import annotations

import copy
import math

import torch

from hnclip.config.objective_keys import g_source
from hnclip.models.factory import load_backbone
from hnclip.runtime.device import AUTOCAST_DEVICE_TYPES
from hnclip.training.frameworks import TrainedModel


def frozen_text_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the initial text tower only (Table 3c): the image tower is not copied."""
    visual = model.visual
    model.visual = None
    try:
        frozen = copy.deepcopy(model)
    finally:
        model.visual = visual
    frozen.requires_grad_(False).eval()
    return frozen


def effective_precision(device: torch.device, requested: str) -> str:
    """bf16 only where `autocast_context` turns autocast on (cuda, npu); fp32 elsewhere."""
    return "bf16" if requested == "bf16" and device.type in AUTOCAST_DEVICE_TYPES else "fp32"


def build_model(job, device: torch.device):
    """(backbone, trained model, frozen text tower or None) as the run starts: init weights, logit
    scale reset, then the framework's wrapping (the frozen-G tower is copied from the bare CLIP)."""
    recipe, objective = job.spec["recipe"], job.spec["objective"]
    backbone = load_backbone(job.init_kind, job.init_path, job.model_config, job.init_sha256)
    base = backbone.model.to(device).train()
    if recipe.get("reset_logit_scale"):
        with torch.no_grad():
            base.logit_scale.fill_(math.log(recipe["reset_logit_scale"]))
    frozen_text = frozen_text_encoder(base) if g_source(objective) == "frozen" else None
    trained = TrainedModel.build(base, objective.get("framework", "full"), recipe.get("adapter"))
    return backbone, trained, frozen_text
