"""The optimizer and the learning-rate schedule of a fine-tuning run."""
from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, recipe: dict, extra_module: torch.nn.Module | None = None
                    ) -> torch.optim.AdamW:
    """AdamW over the trainable parameters. Open_clip's rule by default: no weight decay on gains,
    biases, embeddings and the logit scale; `recipe.decay_all` decays every parameter (GOAL's and
    StructXLIP's released optimizers). An extra module (FineLIP's aggregators) is its own group at
    `recipe.module_lr`. Each group keeps its `base_lr`; the schedule scales all of them alike."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exclude = param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name \
            or "embedding" in name
        (no_decay if exclude and not recipe.get("decay_all") else decay).append(param)
    lr, weight_decay = recipe["lr"], recipe["weight_decay"]
    groups = [{"params": no_decay, "weight_decay": 0.0, "base_lr": lr, "name": "backbone_no_decay"},
              {"params": decay, "weight_decay": weight_decay, "base_lr": lr, "name": "backbone"}]
    if extra_module is not None:
        groups.append({"params": [p for p in extra_module.parameters() if p.requires_grad],
                       "weight_decay": weight_decay, "base_lr": recipe.get("module_lr", lr), "name": "module"})
    groups = [g for g in groups if g["params"]]
    for group in groups:
        group["lr"] = group["base_lr"]
    return torch.optim.AdamW(groups, lr=lr, **adamw_implementation(groups))


def adamw_implementation(groups: list[dict]) -> dict:
    """`fused=True` when every parameter lives on a CUDA device: one kernel per step for all parameters
    instead of torch's default multi-tensor (`foreach`) kernels there. The same update up to fp32 rounding,
    never bitwise: tolerance about 1e-6 relative to the parameters after a few steps (the fused kernel
    orders the same fp32 operations differently; on the CPU torch 2.14's fused AdamW differs from the
    default by 3e-8 after 5 steps on unit-scale parameters); benchmarks/gpu_check.sh records the largest
    difference on the GPU (its `fused_adamw_tolerance` stage). Elsewhere torch's default, as before: CPU
    runs (the embedded default, CI) keep their exact updates (tests/test_step_optimizer.py); NPUs keep the
    default too (their fused kernel is torch_npu's, not verified here). A checkpoint's optimizer state
    loads into either."""
    devices = {p.device.type for group in groups for p in group["params"]}
    return {"fused": True} if devices == {"cuda"} else {}


def param_group_summary(optimizer: torch.optim.Optimizer) -> list[dict]:
    """What train.json records of each parameter group."""
    return [{"name": g["name"], "base_lr": g["base_lr"], "weight_decay": g["weight_decay"],
             "parameters": sum(p.numel() for p in g["params"])} for g in optimizer.param_groups]


def set_learning_rates(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Scale every group's base rate by the schedule's factor at this step."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor


def cosine_lr(step: int, total_steps: int, base_lr: float, warmup_steps: int) -> float:
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * base_lr * (1 + math.cos(math.pi * min(1.0, progress)))


def clamp_logit_scale(model, max_scale: float | None) -> None:
    """`recipe.max_logit_scale`: clamp exp(logit_scale) after every step (None: unclamped, as chosen
    for the paper's recipe, which does not say; open_clip's trainer clamps at 100)."""
    if max_scale is not None:
        with torch.no_grad():
            model.logit_scale.clamp_(max=math.log(max_scale))
