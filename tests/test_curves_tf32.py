"""TensorBoard curves written while a run trains (read back with TensorBoard's own reader), and TF32
set and recorded on CUDA (device mocked)."""
import dataclasses

import pytest
import torch
from helpers.training import EVALUATION, EXECUTION, SPEC

from hnclip.io import read_jsonl
from hnclip.runtime import device as device_module
from hnclip.training.loop import TrainJob, train


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def make_job(tiny_data, out) -> TrainJob:
    return TrainJob(run_id="curves-run", spec=SPEC, spec_hash="c" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution=EXECUTION, evaluation=EVALUATION, curves_dir=out / "logs" / "tiny" / "curves-run")


def test_curves_hold_every_step_and_epoch_as_the_records_do(tiny_data, tmp_path):
    job = make_job(tiny_data, tmp_path)
    record = train(job)
    curves = scalars(job.curves_dir)
    steps = read_jsonl(job.out_dir / "steps.jsonl")
    for term in ("total", "hn", "infonce", "tok"):
        assert dict(curves[f"loss/{term}"]) == pytest.approx({s["step"]: s[f"{term}_mean"] for s in steps}, rel=1e-6)
    for field in ("lr", "logit_scale", "grad_norm"):
        assert dict(curves[f"train/{field}"]) == pytest.approx({s["step"]: s[field] for s in steps}, rel=1e-6)
    assert [step for step, _ in curves["train/images_per_second"]] == [1, 2, 3, 4, 5, 6]
    assert all(value > 0 for _, value in curves["train/images_per_second"] + curves["train/peak_memory_mb"])
    for direction in ("t2i", "i2t"):
        assert dict(curves[f"eval/docci/{direction}_R@1"]) == pytest.approx(
            {h["step"]: h["eval"]["docci"][direction]["R@1"] for h in record["history"]})
    assert len(curves["eval/docci/t2i_R@1"]) == len(record["history"]) == 2


def test_a_resumed_run_replaces_the_steps_logged_after_its_checkpoint(tiny_data, tmp_path, monkeypatch):
    from helpers.training import run_with_faults
    job = make_job(tiny_data, tmp_path)
    proc = run_with_faults(job, {"kill_after_step": 5})  # checkpoint at step 4: step 5 is trained twice
    assert proc.returncode == -9, proc.stderr
    train(job)
    totals = scalars(job.curves_dir)["loss/total"]
    assert [step for step, _ in totals] == [1, 2, 3, 4, 5, 6]  # purged and relogged: one value per step


def test_tf32_is_set_on_cuda_and_recorded_as_not_applicable_elsewhere(monkeypatch):
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        assert device_module.configure_tf32(torch.device("cuda", 0)) is True
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True
        assert device_module.configure_tf32("cuda:0", enabled=False) is False
        assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False
        assert device_module.configure_tf32("cpu") is None and device_module.configure_tf32("npu:0") is None
        monkeypatch.setattr(device_module, "resolve_device", lambda requested: torch.device("cuda", 0))
        assert device_module.compute_device({"device": "auto"}).type == "cuda"
        assert torch.backends.cuda.matmul.allow_tf32 is True  # execution.tf32 defaults to on
        device_module.compute_device({"device": "auto", "tf32": False})
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def test_a_run_records_tf32(tiny_data, tmp_path, monkeypatch):
    import hnclip.training.loop as loop
    seen = []
    real = loop.configure_tf32
    monkeypatch.setattr(loop, "configure_tf32", lambda device, enabled=True: seen.append(enabled) or (
        True if enabled else real(device, enabled)))  # as CUDA would answer
    job = dataclasses.replace(make_job(tiny_data, tmp_path), curves_dir=None,
                              spec={**SPEC, "recipe": {**SPEC["recipe"], "epochs": 1}})
    assert train(job)["training"]["tf32"] is True and seen == [True]
    cpu = train(dataclasses.replace(job, out_dir=tmp_path / "cpu", checkpoint_dir=tmp_path / "cpu-ckpt",
                                    execution={**EXECUTION, "tf32": False}))
    assert cpu["training"]["tf32"] is None and seen == [True, False]  # on a CPU: not applicable
