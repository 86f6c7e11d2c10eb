"""`hnclip train` and `hnclip pretrain`: one training job in its own GPU slot."""
from __future__ import annotations

from dataclasses import replace

from hnclip.config.registry import Registry


def train_run(reg: Registry, run_id: str, until_epoch: int | None = None) -> dict:
    """Fine-tune one registry run (resuming from its checkpoint); returns its training record. With
    `until_epoch`: train through that epoch only, commit its checkpoint and return a record with
    `finished` False (no outputs are written unless it is the run's last epoch)."""
    from hnclip.runtime.gpu_slots import acquire_slot
    from hnclip.training.jobs import finetune_job
    from hnclip.training.loop import train
    job = replace(finetune_job(reg, run_id), until_epoch=until_epoch)
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
