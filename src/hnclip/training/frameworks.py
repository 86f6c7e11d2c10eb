"""What a run trains, per `objective.framework`: the whole CLIP ("full") or LoRA / DoRA adapters on a
frozen copy of it ("lora", "dora"), with how each is checkpointed and exported.

Adapter runs checkpoint only the adapter weights (plus the optimizer): the frozen base is rebuilt
from the init weights on resume, and a digest of it, stored in the checkpoint, proves it is the
same base. The exported model (per-epoch evaluation, `epoch_XX.pt`, the final `model.pt`) is always
a plain open_clip CLIP: for adapter runs the adapters merged in (`merge_adapters`), so evaluation
code loads it with `hnclip.models.factory.load_weights` like any full fine-tune.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hnclip.config.constants import ADAPTER_FRAMEWORKS, BASELINE_FRAMEWORKS, DEFAULT_ADAPTER, TRAINED_FRAMEWORKS
from hnclip.errors import StaleArtifactError
from hnclip.hashing import weights_digest


@dataclass
class TrainedModel:
    framework: str
    module: torch.nn.Module               # what the optimizer updates: a CLIP, or a peft model around one
    base_weights_sha256: str | None = None  # adapter runs: digest of the frozen base
    extra: torch.nn.Module | None = None    # beside the CLIP (FineLIP's aggregators): checkpointed, not exported

    @classmethod
    def build(cls, base: torch.nn.Module, framework: str, adapter: dict | None = None) -> "TrainedModel":
        """`base` as loaded (and logit-scale reset); for lora/dora it is wrapped, not modified."""
        if framework not in (*TRAINED_FRAMEWORKS, *BASELINE_FRAMEWORKS):
            raise ValueError(f"unknown framework {framework!r}; this trainer supports "
                             f"{(*TRAINED_FRAMEWORKS, *BASELINE_FRAMEWORKS)}")
        if framework not in ADAPTER_FRAMEWORKS:  # the baselines fine-tune the whole CLIP, as full does
            return cls(framework, base)
        from hnclip.models.adapters import (
            apply_adapters,  # peft is only needed for adapter runs
        )
        settings = {**DEFAULT_ADAPTER, **(adapter or {})}
        module = apply_adapters(base, framework, r=settings["r"], alpha=settings["alpha"],
                                dropout=settings["dropout"], target=settings["target"])
        return cls(framework, module.train(base.training), weights_digest(base))

    @property
    def uses_adapters(self) -> bool:
        return self.framework in ADAPTER_FRAMEWORKS

    def attach(self, extra: torch.nn.Module) -> None:
        """Train `extra` beside the CLIP (its own optimizer group; in the checkpoint; never exported)."""
        self.extra = extra

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        modules = [self.module] + ([self.extra] if self.extra is not None else [])
        return [p for m in modules for p in m.parameters() if p.requires_grad]

    # ---- checkpoints ------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        extra = {"extra": self.extra.state_dict()} if self.extra is not None else {}
        if not self.uses_adapters:
            return {"model": self.module.state_dict(), **extra}
        from hnclip.models.adapters import adapter_state_dict
        return {"adapter": adapter_state_dict(self.module), "base_weights_sha256": self.base_weights_sha256}

    def restore(self, payload: dict, path: Path) -> None:
        if self.extra is not None:
            self.extra.load_state_dict(payload["extra"])
        if not self.uses_adapters:
            self.module.load_state_dict(payload["model"])
            return
        from hnclip.models.adapters import load_adapter_state_dict
        if payload.get("base_weights_sha256") != self.base_weights_sha256:
            raise StaleArtifactError(f"{path} holds adapters trained on different base weights than the init weights "
                               f"loaded now; delete {path.parent} to start this run afresh")
        load_adapter_state_dict(self.module, payload["adapter"])

    # ---- export -----------------------------------------------------------------------------------
    def export(self) -> torch.nn.Module:
        """A plain open_clip CLIP with the trained weights: the model itself for full fine-tuning
        (no copy), a merged copy for adapter runs (the adapters keep training)."""
        if not self.uses_adapters:
            return self.module
        from hnclip.models.adapters import merge_adapters
        return merge_adapters(self.module)
