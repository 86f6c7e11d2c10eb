"""Turn registry entries into executable jobs (training runs, backbone pretraining, datasets); the specs
themselves are the registry's (`hnclip.config.registry`)."""
from __future__ import annotations

from hnclip.config import paths
from hnclip.config.constants import PRETRAIN_ROLE
from hnclip.config.registry import Registry, make_run_id, pretrain_spec
from hnclip.evaluation.selection import own_benchmark


def finetune_job(reg: Registry, run_id: str):
    from hnclip.models.factory import backbone_pin
    from hnclip.training.loop import (
        TrainJob,  # torch: imported only by the jobs that train (Snakefile parsing stays light)
    )
    run = reg.run(run_id)
    backbone = reg.backbone_spec()
    name = reg.backbone_name()
    data_root = reg.profile["data_root"]
    auxiliary = reg.auxiliary_inputs(run_id)
    execution = {**reg.profile["execution"], "grad_probe_every": reg.probe_every(run_id),
                 "cost_only_settings": reg.released_costs(run_id),
                 "compute_batch": reg.profile["recipe"].get("compute_batch", reg.profile["recipe"]["micro_batch"])}
    return TrainJob(
        run_id=run_id, spec=run.spec, spec_hash=run.spec_hash,
        init_kind=backbone["kind"], init_path=paths.backbone_weights(name, backbone["kind"], data_root),
        model_config=backbone["model_config"], init_sha256=backbone_pin(reg.profile, backbone),
        train_manifest=reg.train_manifest(run.train_set),
        eval_manifests={b: reg.test_manifest(b) for b in reg.eval_benchmarks(run.train_set)},
        selection_benchmark=own_benchmark(reg.eval_benchmarks(run.train_set)),
        out_dir=paths.run_dir(run_id), checkpoint_dir=paths.checkpoint_dir(run_id),
        execution=execution, evaluation=reg.params["evaluation"],
        eval_cache_dir=paths.EVAL_CACHE, auxiliary=auxiliary, curves_dir=paths.curves_dir(reg.profile_name, run_id),
        extra_inputs={f"auxiliary:{kind}": path for kind, path in auxiliary.items()})




def pretrain_job(reg: Registry, name: str):
    from hnclip.training.loop import TrainJob
    spec = pretrain_spec(reg, name)
    _, digest = make_run_id(spec)  # the readable part is rebuilt below with a backbone- prefix
    data_root = reg.profile["data_root"]
    return TrainJob(
        run_id=f"backbone-{name}-{digest[:8]}", spec=spec, spec_hash=digest, init_kind="scratch", init_path=None,
        model_config=spec["init"]["model_config"],
        train_manifest=paths.manifest(data_root, PRETRAIN_ROLE, "train"),
        eval_manifests={"pretrain_test": paths.manifest(data_root, PRETRAIN_ROLE, "test")},
        out_dir=paths.backbone_dir(name), checkpoint_dir=paths.checkpoint_dir(f"backbone-{name}"),
        execution={**reg.profile["execution"], "keep_epoch_weights": False, "grad_probe_every": 0},
        evaluation=reg.params["evaluation"], evaluate_epochs="last",  # on the critical path: one evaluation
        curves_dir=paths.curves_dir(reg.profile_name, f"backbone-{name}"))
