"""How each framework turns training data into its named loss terms, one micro-batch at a time.

`full`, `lora` and `dora` train the HN-CLIP objective (`hnclip.losses.objective`): L_HN or
InfoNCE, plus lambda * L_tok. The machinery baselines train their own objectives
(`hnclip.losses.finelip`, `.goal`, `.structxlip`), whose global image-caption term becomes L_HN
when the run's objective has gamma > 0 (the paper's plug-and-play swap, D.2); their other terms are
untouched. Each method says what one micro-batch holds (`load`), its terms (`terms`), what
happens after each optimizer step (StructXLIP clamps the logit scale), which extra module,
if any, trains beside the CLIP (FineLIP's aggregators, at their own learning rate) and, where the
release has its own, the learning-rate schedule (FineLIP's).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from hnclip.config.constants import BASELINE_FRAMEWORKS, TRAINED_FRAMEWORKS
from hnclip.data.feeding import to_device
from hnclip.losses.objective import Autocast, loss_terms

HN_CLIP_LOSS_NAMES = ("infonce", "hn", "tok", "total")  # the objective's terms (`losses.objective.group_terms`)


@dataclass(frozen=True)
class Position:
    """Where a micro-batch sits in training (FineLIP's epoch-0 warm-up, StructXLIP's weight schedule)."""
    epoch: int                 # 0-based
    micro_batch: int           # 0-based index within the epoch
    micro_batches_per_epoch: int


@dataclass
class Method:
    framework: str
    load: Callable[[list[int]], Any]                       # indices -> one micro-batch, on the CPU
    terms: Callable[..., dict[str, torch.Tensor]]          # (model, batch on device, position, autocast)
    extra_module: torch.nn.Module | None = None           # trained beside the CLIP, checkpointed, not exported
    after_step: Callable[[torch.nn.Module], None] = lambda model: None
    # (first micro-batch of the step, micro-batches of the run, grad_accum) -> factor of the base rates;
    # None: the profile's schedule (`schedule.cosine_lr`)
    lr_factor: Callable[[int, int, int], float] | None = None
    summary: dict = field(default_factory=dict)           # recorded in train.json (e.g. fallback counts)
    # every named term `terms` can return: the non-finite guard, steps.jsonl and the epoch summaries read these
    loss_names: tuple[str, ...] = ("infonce", "hn", "tok", "total")
    # the function `terms` computes the named terms with (the function object it calls, never a name typed
    # by hand): train.json names it as the code of the run's loss terms (None: not recorded)
    loss_function: Callable[..., dict[str, torch.Tensor]] | None = None
    # uint8 images -> the model's input, on the device (`load` hands over the image cache's pixels); None:
    # `load` hands over model inputs already
    normalize: Callable[[torch.Tensor], torch.Tensor] | None = None
    # `load` only reads memory (the image cache's pixels and the tokens made up front): loader workers are
    # threads of the training process (`hnclip.data.feeding.ThreadFeed`); else processes that decode
    load_reads_memory: bool = False

    def to_device(self, batch, device: torch.device):
        """A loaded micro-batch on the device: tensors copied without blocking from pinned memory on an
        accelerator, uint8 images (the image cache's) normalized there."""
        if isinstance(batch, tuple):
            moved = tuple(to_device(part, device) for part in batch)
            return tuple(self.normalize(part) if self.normalize is not None and part.dtype == torch.uint8 else part
                         for part in moved)
        return batch.to(device)

    @property
    def encodes_plain_pairs(self) -> bool:
        """Whether a micro-batch is (images, tokens) under the HN-CLIP objective, the case the exact
        large-batch and compute-batch modes and the gradient probe are written for."""
        return self.framework in TRAINED_FRAMEWORKS


def build_method(framework: str, objective: dict, settings: dict, model: torch.nn.Module, train_set,
                 auxiliary: dict[str, Path], tokenizer, frozen_text=None) -> Method:
    """The method of a run. `settings` are the framework's resolved protocol settings (run spec),
    `auxiliary` the paths of its auxiliary inputs (GOAL: segments, StructXLIP: edges)."""
    if framework in TRAINED_FRAMEWORKS:
        compute = loss_terms

        def terms(model, batch, position, autocast: Autocast = contextlib.nullcontext):
            return compute(model, *batch, objective, frozen_text, autocast, (position.epoch, position.micro_batch))
        return Method(framework, terms=terms, loss_function=compute, **_pair_loading(train_set, model))
    if framework == "finelip":
        return _finelip(objective, settings, model, train_set)
    if framework == "goal":
        return _goal(objective, settings, model, train_set, auxiliary, tokenizer)
    if framework == "structxlip":
        return _structxlip(objective, settings, train_set, auxiliary, tokenizer)
    raise ValueError(f"unknown framework {framework!r}; this trainer supports "
                     f"{(*TRAINED_FRAMEWORKS, *BASELINE_FRAMEWORKS)}")


FINELIP_LR_SCHEDULES = ("released", "cosine")
FINELIP_TRAINER_SETTINGS = ("epoch0_warmup", "lr_schedule", "warmup_micro_steps")  # the trainer's, not the loss's


def finelip_released_lr(first_micro_step: int, total_micro_steps: int, grad_accum: int,
                        warmup_micro_steps: int = 200) -> float:
    """FineLIP's released learning-rate schedule, as a factor of every group's base rate, for the optimizer
    step whose first micro-batch is `first_micro_step` (0-based over the run).

    FL @9389127 (train/scheduler.py:10-27; train/train.py:186, 204-207, 279-285) builds
    `cosine_lr(warmup_length=200, steps=epochs * len(loader) / accumulation_steps)` and calls it after each
    optimizer step with `step` = the index of that step's last micro-batch. So step 0 runs at the base rate
    and a later step at f(k), k = its first micro-batch - 1:
        f(k) = (k + 1) / W                                     for k < W   (W = 200 micro-batches)
        f(k) = 1/2 (1 + cos(pi (k - W) / (K - W)))             otherwise, K = total_micro_steps / grad_accum
    k counts micro-batches but K optimizer steps, so the cosine runs grad_accum times too fast: at the
    release's 4x accumulation the rate is 0 at a quarter and about three quarters of training and back near
    the base rate at about half and at the end (W shifts the later turns by a little when K >> W); at the
    protocol's 8x it is 0 first at 1/8, then about every quarter. A run shorter than W micro-batches never
    leaves the warm-up.
    """
    if first_micro_step == 0:
        return 1.0
    k = first_micro_step - 1
    if k < warmup_micro_steps:
        return (k + 1) / warmup_micro_steps
    span = total_micro_steps / grad_accum - warmup_micro_steps
    if span == 0:
        raise ValueError(f"FineLIP's released schedule is undefined when the run's optimizer steps "
                         f"({total_micro_steps} / {grad_accum}) equal its warm-up ({warmup_micro_steps}); "
                         f"change warmup_micro_steps or the run's length")
    return 0.5 * (1.0 + math.cos(math.pi * (k - warmup_micro_steps) / span))


def _finelip(objective: dict, settings: dict, model, train_set) -> Method:
    from hnclip.losses.finelip import (
        build_finelip_module,
        fine_warmup_factor,
        finelip_loss_terms,
    )
    warmup = settings["epoch0_warmup"]
    schedule = settings["lr_schedule"]
    if schedule not in FINELIP_LR_SCHEDULES:
        raise ValueError(f"FineLIP lr_schedule must be one of {FINELIP_LR_SCHEDULES}, got {schedule!r}")
    loss_settings = {key: value for key, value in settings.items() if key not in FINELIP_TRAINER_SETTINGS}
    module = build_finelip_module(model, loss_settings).to(next(model.parameters()).device)

    def terms(model, batch, position: Position, autocast: Autocast = contextlib.nullcontext):
        factor = fine_warmup_factor(position.epoch, position.micro_batch, position.micro_batches_per_epoch) \
            if warmup else 1.0
        return finelip_loss_terms(model, module, *batch, objective, loss_settings, factor, autocast)

    lr_factor = None
    if schedule == "released":
        warmup_micro_steps = settings["warmup_micro_steps"]

        def lr_factor(first_micro_step: int, total_micro_steps: int, grad_accum: int) -> float:
            return finelip_released_lr(first_micro_step, total_micro_steps, grad_accum, warmup_micro_steps)
    return Method("finelip", terms=terms, extra_module=module, lr_factor=lr_factor,
                  loss_names=("infonce", "hn", "fine", "total"), loss_function=finelip_loss_terms,
                  **_pair_loading(train_set, model))


def _goal(objective: dict, settings: dict, model, train_set, auxiliary: dict[str, Path], tokenizer) -> Method:
    from hnclip.auxiliary.batches import GoalInputs
    from hnclip.losses.goal import GoalSettings, goal_loss_terms
    # the cost-only operations (double forward, anomaly detection) run only where the job asks (Registry.released_costs)
    goal_settings = GoalSettings.from_dict({"double_forward": False,
                                            **{k: v for k, v in settings.items() if k != "anomaly_detection"}})
    inputs = GoalInputs(train_set, auxiliary["segments"], tokenizer, _grid_size(model.visual.image_size),
                        _grid_size(model.visual.patch_size), goal_settings)
    # The released step runs with autograd anomaly detection on: a cost only (Table A3), kept as a setting.
    anomaly = bool(settings.get("anomaly_detection", False))

    def terms(model, batch, position: Position, autocast: Autocast = contextlib.nullcontext):
        with torch.autograd.set_detect_anomaly(anomaly):
            return goal_loss_terms(model, batch, objective, goal_settings, autocast)
    return Method("goal", inputs.batch, terms, summary={"images_without_segment": inputs.fallbacks,
                                                          "images": len(inputs.rows)},
                  loss_names=("infonce", "hn", "org", "seg", "patch", "text", "total"), loss_function=goal_loss_terms)


def _structxlip(objective: dict, settings: dict, train_set, auxiliary: dict[str, Path], tokenizer) -> Method:
    from hnclip.auxiliary.batches import StructXInputs
    from hnclip.losses.structxlip import clamp_logit_scale_, structxlip_loss_terms
    inputs = StructXInputs(train_set, auxiliary["edges"], tokenizer, settings)
    loss_settings = {k: settings[k] for k in ("weights", "floors", "decay_epochs", "chunk_tokens")}
    max_log_scale = settings["max_log_scale"]

    def terms(model, batch, position: Position, autocast: Autocast = contextlib.nullcontext):
        return structxlip_loss_terms(model, batch, objective, loss_settings, position.epoch, autocast)

    def clamp(model):
        if max_log_scale is not None:
            clamp_logit_scale_(model, max_log_scale)
    return Method("structxlip", inputs.batch, terms, after_step=clamp,
                  loss_names=("infonce", "hn", "g", "sc", "rs", "lsc", "total"), loss_function=structxlip_loss_terms)


def _pair_loading(train_set, model: torch.nn.Module) -> dict:
    """Method's `load`, `normalize` and `load_reads_memory` for (images, tokens) micro-batches: uint8 pixels
    of the image cache normalized on an accelerator where the training set has one (4x less to copy), else
    model inputs made by `load` (on the CPU the loader workers normalize the cached pixels, not the training
    thread). From the image cache a load only reads memory."""
    cached = getattr(train_set, "pixels", None) is not None
    if cached and next(model.parameters()).device.type != "cpu":
        return {"load": train_set.pixel_batch, "normalize": train_set.normalize, "load_reads_memory": True}
    return {"load": train_set.batch, "normalize": None, "load_reads_memory": cached}


def _grid_size(size) -> int:
    return int(size[0] if isinstance(size, (tuple, list)) else size)
