"""`hnclip train` and `hnclip pretrain`: one training job in its own GPU slot."""
from __future__ import annotations

from hnclip.config.registry import Registry


def train_run(reg: Registry, run_id: str) -> dict:
    """Fine-tune one registry run (resuming from its checkpoint); returns its training record."""
    from hnclip.runtime.gpu_slots import acquire_slot
    from hnclip.training.jobs import finetune_job
    from hnclip.training.loop import train
    job = finetune_job(reg, run_id)
    with acquire_slot():  # this job's own GPU(s) when Snakemake runs several at once; no-op on CPU/SLURM
        return train(job)


def pretrain_backbone(reg: Registry, name: str | None = None) -> dict:
    """Pretrain the embedded backbone on its synthetic corpus; returns its training record."""
    from hnclip.runtime.gpu_slots import acquire_slot
    from hnclip.training.jobs import pretrain_job
    from hnclip.training.loop import train
    job = pretrain_job(reg, name or reg.backbone_name())
    with acquire_slot():
        return train(job)
