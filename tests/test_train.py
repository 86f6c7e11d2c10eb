"""Training loop: resume after a SIGKILL reaches the same weights (from the checkpoint before the newest
when the newest does not load); a run trained in parts (--until-epoch) too; NaN stops with the checkpoint
kept."""
import json
import math
import shutil

import pytest
import torch
from helpers.training import EVALUATION, EXECUTION, SPEC, run_with_faults

from hnclip.training.batching import epoch_micro_batches
from hnclip.training.loop import NonFiniteLossError, TrainJob, train
from hnclip.training.schedule import cosine_lr


def make_job(tiny_data, out, spec=SPEC):
    return TrainJob(run_id="test-run", spec=spec, spec_hash="h" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution=EXECUTION, evaluation=EVALUATION)


def test_schedule_and_batches_are_deterministic():
    assert cosine_lr(0, 10, 1.0, 0) == 1.0 and cosine_lr(10, 10, 1.0, 0) == pytest.approx(0.0)
    assert cosine_lr(0, 10, 1.0, 2) == 0.5
    a = epoch_micro_batches(list(range(50)), 16, seed=1, epoch=0)
    assert a == epoch_micro_batches(list(range(50)), 16, seed=1, epoch=0)
    assert a != epoch_micro_batches(list(range(50)), 16, seed=1, epoch=1)
    assert [len(b) for b in a] == [16, 16, 16]  # incomplete tail dropped


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory) -> dict:
    """An uninterrupted run's record, with the optimizer steps its checkpoints were written at."""
    import hnclip.training.checkpoint as checkpoint
    saved_at, real_write = [], checkpoint.write_checkpoint
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint, "write_checkpoint", lambda directory, payload:
                      saved_at.append(payload["state"]["step"]) or real_write(directory, payload))
        record = train(make_job(tiny_data, tmp_path_factory.mktemp("uninterrupted")))
    return {**record, "saved_at": saved_at}


def test_killed_run_resumes_to_identical_result(tiny_data, tmp_path, reference):
    assert reference["optimizer_steps"] == 6  # 48 pairs / 8 = 6 micro-batches / 2 = 3 steps, 2 epochs
    assert reference["saved_at"] == [2, 3, 4, 6]  # every 2 steps and at each epoch's end, which step 6 is: written once

    job = make_job(tiny_data, tmp_path / "killed")
    proc = run_with_faults(job, {"kill_after_step": 5})
    assert proc.returncode == -9, proc.stderr  # SIGKILL after optimizer step 5
    assert not (job.out_dir / "model.pt").exists()
    saved = torch.load(job.checkpoint_dir / "last.pt", weights_only=True)["state"]
    assert saved["step"] == 4  # checkpoints every 2 steps: step 5 is lost and replayed

    assert torch.load(job.checkpoint_dir / "previous.pt", weights_only=True)["state"]["step"] == 3
    shutil.copytree(job.checkpoint_dir, tmp_path / "truncated")

    resumed = train(job)
    assert resumed["resumed_from_step"] == 4
    assert resumed["training"]["resume"] == {"checkpoint": "last.pt", "step": 4, "failed": []}
    assert resumed["final_weights_sha256"] == reference["final_weights_sha256"]
    assert resumed["history"][-1]["eval"] == reference["history"][-1]["eval"]
    assert [h["weights_sha256"] for h in resumed["history"]] == [h["weights_sha256"] for h in reference["history"]]

    # the newest checkpoint cut short (a crash of the disk, not of the write): the one before is resumed
    job.checkpoint_dir, job.out_dir = tmp_path / "truncated", tmp_path / "truncated_run"
    newest = job.checkpoint_dir / "last.pt"
    newest.write_bytes(newest.read_bytes()[:4096])
    (job.checkpoint_dir / ".last.pt.x1y2z3.part").write_bytes(b"a save killed half-way")
    fallback = train(job)
    assert fallback["resumed_from_step"] == 3  # previous.pt: the end of epoch 1
    assert fallback["training"]["resume"]["checkpoint"] == "previous.pt"
    assert fallback["training"]["resume"]["failed"][0].startswith("last.pt: ")
    assert fallback["final_weights_sha256"] == reference["final_weights_sha256"]


def test_a_run_trained_in_parts_until_each_epoch_reaches_the_same_weights(tiny_data, tmp_path, reference):
    job = make_job(tiny_data, tmp_path / "parts")
    job.until_epoch = 1
    part = train(job)
    assert part["finished"] is False and (part["epochs_done"], part["optimizer_steps"]) == (1, 3)
    assert not job.out_dir.exists()  # no outputs before the last epoch
    assert torch.load(job.checkpoint_dir / "last.pt", weights_only=True)["state"]["epoch"] == 1
    assert train(job)["optimizer_steps"] == 3  # already through epoch 1: nothing to train
    job.until_epoch = 2  # the last epoch: the run finishes and writes its outputs
    final = train(job)
    assert final["resumed_from_step"] == 3 and final["optimizer_steps"] == 6
    assert [h["weights_sha256"] for h in final["history"]] == [h["weights_sha256"] for h in reference["history"]]
    assert (job.out_dir / "model.pt").exists() and not job.checkpoint_dir.exists()


def test_a_finished_run_rerun_to_probe_its_gradients_trains_again_and_probes(tiny_data, tmp_path, capsys):
    """Snakemake reruns a run whose probe setting changed (tiny -> tiny_seeds); its resume checkpoint
    is at the last step, so resuming would record no probe: it trains afresh, to the same weights."""
    job = make_job(tiny_data, tmp_path)
    job.execution = {**EXECUTION, "keep_resume_checkpoints": True}  # else nothing is left to resume
    first = train(job)
    assert not (job.out_dir / "grad_probe.jsonl").exists()  # not probed
    job.execution = {**job.execution, "grad_probe_every": 1}
    again = train(job)
    assert "training afresh" in capsys.readouterr().err and again["resumed_from_step"] is None
    probes = (job.out_dir / "grad_probe.jsonl").read_text().splitlines()
    assert len(probes) == again["optimizer_steps"] == 6
    assert again["final_weights_sha256"] == first["final_weights_sha256"]
    assert train(job)["resumed_from_step"] == 6  # same settings: the checkpoint is used


def test_a_checkpoint_trained_from_other_data_or_weights_is_not_resumed(tiny_data, tmp_path, capsys):
    """A run id names a real dataset and a downloaded backbone by source, not by content: after a new
    release (a re-released archive, a re-uploaded Long-CLIP-L) the same run must train afresh from what
    is there now, not resume the weights trained from the old one."""
    import shutil
    data = tmp_path / "docci"
    shutil.copytree(tiny_data["train"].parent, data)
    job = make_job({"train": data / "train.jsonl", "test": data / "test.jsonl"}, tmp_path)
    job.execution = {**EXECUTION, "keep_resume_checkpoints": True}  # a killed run's state, kept to the end
    train(job)
    assert train(job)["resumed_from_step"] == 6  # the same content: the finished checkpoint is used
    rows = (data / "train.jsonl").read_text().splitlines()
    first = json.loads(rows[0])
    rows[0] = json.dumps({**first, "caption": first["caption"] + " A new release."})
    (data / "train.jsonl").write_text("\n".join(rows) + "\n")
    again = train(job)
    assert again["resumed_from_step"] is None and again["optimizer_steps"] == 6
    assert "other initial weights or training data" in capsys.readouterr().err


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_data, tmp_path, monkeypatch):
    import hnclip.training.methods as train_module  # where the loop's micro-batch terms come from
    real_terms = train_module.loss_terms
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        terms = real_terms(*args, **kwargs)
        if calls["n"] == 7:  # 4th optimizer step (2 micro-batches per step)
            terms["total"] = terms["total"] * float("nan")
        return terms

    monkeypatch.setattr(train_module, "loss_terms", poisoned)
    job = make_job(tiny_data, tmp_path)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at epoch 2, optimizer step 4.*last good checkpoint"):
        train(job)
    payload = torch.load(job.checkpoint_dir / "last.pt", weights_only=True)
    assert payload["state"]["step"] == 3  # end of epoch 1, written before the bad step
    assert all(torch.isfinite(t).all() for t in payload["model"].values() if t.is_floating_point())
    assert not (job.out_dir / "model.pt").exists()


def test_training_record_and_step_log(tiny_data, tmp_path):
    record = train(make_job(tiny_data, tmp_path))
    assert [h["epoch"] for h in record["history"]] == [1, 2]
    epoch = record["history"][0]
    assert {"hn_mean", "infonce_mean", "tok_mean", "infonce_saturated_frac", "hn_saturated_frac"} <= set(epoch["train"])
    assert set(epoch["eval"]["docci"]) >= {"t2i", "i2t", "ties", "n"}
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 6 and all(math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0 for s in steps)
    assert steps[0]["lr"] == pytest.approx(1e-3) and steps[-1]["lr"] < steps[0]["lr"]
    assert record["spec"] == SPEC and record["inputs"]["train_manifest"]["sha256"]


def test_frozen_margin_stays_constant_while_live_drifts(tiny_data):
    from hnclip.data.loader import PairDataset
    from hnclip.losses import margin_matrix
    from hnclip.losses.objective import loss_terms
    from hnclip.models.factory import create
    from hnclip.models.towers import encode_text
    from hnclip.training.model_setup import frozen_text_encoder
    from hnclip.training.schedule import build_optimizer

    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    model = backbone.model
    frozen = frozen_text_encoder(model)
    assert frozen.visual is None and model.visual is not None
    assert not any(p.requires_grad for p in frozen.parameters())
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    images, tokens = data.batch(range(8))
    optimizer = build_optimizer(model, {"lr": 1e-3, "weight_decay": 0.0})
    objective = {"gamma": 0.5, "lambda_tok": 0.0, "g_source": "frozen"}
    g_frozen, g_live = [], []
    for _ in range(3):
        with torch.no_grad():
            g_frozen.append(margin_matrix(encode_text(frozen, tokens), 0.5))
            g_live.append(margin_matrix(encode_text(model, tokens), 0.5))
        optimizer.zero_grad()
        loss_terms(model, images, tokens, objective, frozen)["total"].backward()
        optimizer.step()
    assert all(torch.equal(g_frozen[0], g) for g in g_frozen[1:])
    assert not torch.allclose(g_live[0], g_live[-1], atol=1e-4)


def test_saved_weights_are_checked_against_the_last_evaluated_epoch(tmp_path):
    """The training job rereads model.pt: the evaluation jobs rely on it holding exactly the
    weights whose metrics the last epoch recorded."""
    from hnclip.hashing import weights_digest
    from hnclip.models.factory import save_weights
    from hnclip.training.outputs import saved_weights_match as _saved_weights_match
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "model.pt"
    save_weights(model, "hnclip-tiny", path)
    assert _saved_weights_match(path, [{"weights_sha256": weights_digest(model)}]) is True
    assert _saved_weights_match(path, []) is None  # nothing was evaluated (no epoch finished)
    with torch.no_grad():
        model.weight.add_(1e-6)
    with pytest.raises(RuntimeError, match="saved weights differ from those evaluated at the last epoch"):
        _saved_weights_match(path, [{"weights_sha256": weights_digest(model)}])


def test_pretraining_evaluates_its_last_epoch_only(tiny_data, tmp_path, params):
    """Backbone pretraining is on the critical path and reports only its final score: it evaluates once,
    after its last epoch, and still fingerprints every epoch's weights; fine-tuning evaluates every epoch."""
    import dataclasses

    from hnclip.config.registry import Registry
    from hnclip.training.jobs import pretrain_job
    assert pretrain_job(Registry(params), Registry(params).backbone_name()).evaluate_epochs == "last"
    job = dataclasses.replace(make_job(tiny_data, tmp_path), evaluate_epochs="last")
    history = train(job)["history"]
    assert [bool(h["eval"]) for h in history] == [False, True]
    assert "docci" in history[-1]["eval"] and all(h["weights_sha256"] for h in history)
    assert all(h["eval"] for h in train(make_job(tiny_data, tmp_path / "every"))["history"])
