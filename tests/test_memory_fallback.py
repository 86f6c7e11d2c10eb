"""Out-of-memory fallbacks of the training step, by fault injection (HNCLIP_FAULTS): the compute batch
is halved and the group retried, the gradient is the one the larger batch gives, and a run killed
right after the fallback resumes without trying the failing size again."""
import json

import pytest
import torch
from helpers.training import EVALUATION, EXECUTION, SPEC, run_with_faults

from hnclip.data.loader import PairDataset
from hnclip.evaluation import retrieval
from hnclip.models.factory import create
from hnclip.runtime.out_of_memory import HalvingBatch
from hnclip.training import loop, memory
from hnclip.training import probe as probe_module
from hnclip.training.faults import FAULTS_ENV, Faults
from hnclip.training.loop import TrainJob, train
from hnclip.training.probe import GradientProbe

# micro-batch 8, 2 micro-batches a group: compute_batch 16 encodes a whole group per forward
COMPUTE = {**EXECUTION, "compute_batch": 16}


def make_job(tiny_data, out, execution=COMPUTE) -> TrainJob:
    return TrainJob(run_id="memory-run", spec=SPEC, spec_hash="m" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution=execution, evaluation=EVALUATION)


def gradients_by_step(monkeypatch) -> list[list[torch.Tensor]]:
    """Every optimizer step's accumulated gradient, as the loop hands it to the optimizer."""
    captured, real = [], loop.gradient_norm

    def capture(model):
        captured.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
        return real(model)
    monkeypatch.setattr(loop, "gradient_norm", capture)
    return captured


def test_the_plan_halves_then_checkpoints_then_gives_up():
    plan, log = memory.MemoryPlan(64, 16), []
    assert plan.shrink(3, log.append) and plan.compute_batch == 32
    assert plan.shrink(3, log.append) and plan.compute_batch == 16
    assert plan.shrink(4, log.append) and plan.activation_checkpointing
    assert not plan.shrink(5, log.append)
    assert plan.fallbacks == [{"step": 3, "compute_batch": [64, 32]}, {"step": 3, "compute_batch": [32, 16]},
                              {"step": 4, "activation_checkpointing": [False, True]}]
    assert log[-1] == "out of memory at 16 pairs per forward; retrying with activation checkpointing"


def test_a_saved_plan_is_never_grown_back():
    saved = memory.MemoryPlan(32, 16, activation_checkpointing=True, fallbacks=[{"step": 2}]).as_dict()
    resumed = memory.MemoryPlan(128, 16).resumed_from(saved)
    assert (resumed.compute_batch, resumed.activation_checkpointing, resumed.fallbacks) == (32, True, [{"step": 2}])
    assert memory.MemoryPlan(16, 16).resumed_from(saved).compute_batch == 16


def test_an_injected_fault_names_step_and_size(monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"oom": {"step": 2, "max_pairs": 8}}))
    faults = Faults.from_env()
    faults.before_forward(1, 16, False)  # another step: nothing
    faults.before_forward(2, 8, False)   # small enough: nothing
    with pytest.raises(torch.OutOfMemoryError, match="step 2, 16 pairs"):
        faults.before_forward(2, 16, False)
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"kill_after": 3}))
    with pytest.raises(Exception, match="unknown keys"):
        Faults.from_env()


def test_compute_batch_fallback_keeps_the_gradient_and_records_the_size(tiny_data, tmp_path, monkeypatch):
    reference_grads = gradients_by_step(monkeypatch)
    reference = train(make_job(tiny_data, tmp_path / "reference"))
    assert reference["training"]["compute_batch"] == 16 and reference["training"]["memory_fallbacks"] == []

    monkeypatch.undo()
    fallback_grads = gradients_by_step(monkeypatch)
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"oom": {"step": 1, "max_pairs": 8}}))
    record = train(make_job(tiny_data, tmp_path / "fallback"))
    assert record["training"]["compute_batch"] == 8
    assert record["training"]["memory_fallbacks"] == [{"step": 1, "compute_batch": [16, 8]}]
    assert record["optimizer_steps"] == reference["optimizer_steps"] == len(fallback_grads) == 6
    # step 0 is the same computation; step 1 is retried at 8 pairs per forward from the same weights
    for reference_step, fallback_step in zip(reference_grads[:2], fallback_grads[:2], strict=True):
        for a, b in zip(reference_step, fallback_step, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert (tmp_path / "fallback" / "ckpt").exists() is False  # retention: the memory plan went with it


def test_a_run_killed_after_a_fallback_resumes_at_the_smaller_size(tiny_data, tmp_path, monkeypatch):
    job = make_job(tiny_data, tmp_path / "killed")
    proc = run_with_faults(job, {"oom": {"step": 1, "max_pairs": 8}, "kill_after_fallback": True})
    assert proc.returncode == -9, proc.stderr
    assert "16 pairs per forward ran out of memory; trying 8" in proc.stderr
    lesson = json.loads((job.checkpoint_dir / "memory.json").read_text())
    assert lesson["compute_batch"] == 8 and lesson["fallbacks"] == [{"step": 1, "compute_batch": [16, 8]}]

    # now every forward above 8 pairs would run out of memory (and be recorded as a new fallback)
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"oom": {"step": None, "max_pairs": 8}}))
    resumed = train(job)
    assert resumed["training"]["compute_batch"] == 8
    assert resumed["training"]["memory_fallbacks"] == [{"step": 1, "compute_batch": [16, 8]}]  # no new attempt


def test_out_of_memory_with_the_smallest_plan_says_what_to_change(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"oom": {"step": 0, "max_pairs": 0}}))
    job = make_job(tiny_data, tmp_path)
    with pytest.raises(memory.MemoryExhaustedError, match="memory-run: out of memory at optimizer step 1 with 8 "
                                                          "pairs per forward and activation checkpointing"):
        train(job)
    lesson = json.loads((job.checkpoint_dir / "memory.json").read_text())
    assert lesson["compute_batch"] == 8 and lesson["activation_checkpointing"] is True


def test_activation_checkpointing_reaches_both_towers_through_adapters():
    from hnclip.models.factory import create
    from hnclip.training.frameworks import TrainedModel
    trained = TrainedModel.build(create("hnclip-tiny").model, "lora")
    memory.set_activation_checkpointing(trained.module, True)
    flags = [m.grad_checkpointing for m in trained.module.modules() if hasattr(m, "resblocks")]
    assert len(flags) == 2 and all(flags)


# ---- the same fallback beyond the training step: evaluation's encoding and the gradient probe ------------
def failing_once_at(size: int, real):
    """`real`, except that its first call on a batch of `size` items raises torch's out-of-memory error."""
    calls = {"failed": 0}

    def wrapped(model, batch, *args, **kwargs):
        if len(batch) == size and not calls["failed"]:
            calls["failed"] += 1
            raise torch.OutOfMemoryError(f"out of memory (injected: {size} items)")
        return real(model, batch, *args, **kwargs)
    return wrapped, calls


def test_halving_batch_halves_to_its_minimum_and_records_each_halving():
    halving, log, sizes = HalvingBatch(16, minimum=4, what="pairs"), [], []

    def attempt(size):
        sizes.append(size)
        if size > 4:
            raise torch.OutOfMemoryError("out of memory")
        return size
    assert halving.run(attempt, "cpu", log.append) == 4 and sizes == [16, 8, 4]
    assert halving.record() == {"what": "pairs", "requested": 16, "used": 4, "halvings": [[16, 8], [8, 4]]}
    assert log[0] == "pairs: 16 ran out of memory; retrying with 8"
    with pytest.raises(torch.OutOfMemoryError):  # at the minimum: the error itself
        halving.run(lambda size: attempt(size + 1), "cpu", log.append)
    with pytest.raises(ValueError, match="not memory"):  # any other error at once
        HalvingBatch(8).run(lambda size: (_ for _ in ()).throw(ValueError("not memory")), "cpu")
    assert HalvingBatch(8).record() is None


@pytest.mark.parametrize("tower", ["encode_image", "encode_text"])
def test_evaluation_halves_a_batch_that_runs_out_of_memory_with_the_same_recall(tiny_data, monkeypatch, tower):
    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    data = PairDataset.from_manifest(tiny_data["test"], backbone.preprocess, backbone.tokenizer)
    expected = retrieval.evaluate_model(backbone.model, data, [1, 5], "pessimistic", batch_size=len(data))
    images, texts = retrieval.encode_images(backbone.model, data, len(data)), retrieval.encode_texts(
        backbone.model, data, len(data))
    failing, calls = failing_once_at(len(data), getattr(retrieval, tower))
    monkeypatch.setattr(retrieval, tower, failing)
    faulted = retrieval.evaluate_model(backbone.model, data, [1, 5], "pessimistic", batch_size=len(data))
    assert calls["failed"] == 1
    assert faulted.pop("memory_fallback") == {"what": "eval_batch_size", "requested": len(data),
                                              "used": len(data) // 2, "halvings": [[len(data), len(data) // 2]]}
    assert "memory_fallback" not in expected and faulted == expected  # Recall@K, ranks and ties
    # the features themselves: each item's does not depend on its batch (up to float rounding)
    halved = HalvingBatch(len(data), size=len(data) // 2)
    assert torch.allclose(retrieval.encode_images(backbone.model, data, len(data), halving=halved), images, atol=1e-6)
    assert torch.allclose(retrieval.encode_texts(backbone.model, data, len(data), halving=halved), texts, atol=1e-6)


def test_the_probe_halves_its_pairs_per_forward_with_the_same_measurement(tiny_data, monkeypatch):
    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    model = backbone.model.train()
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    images, tokens = data.batch(range(4))
    objective = {"framework": "full", "gamma": 0.5, "lambda_tok": 0.0, "g_source": "live"}
    expected = GradientProbe.from_settings({"grad_probe_every": 1}, objective).measure(
        model, list(model.parameters()), images, tokens)
    failing, calls = failing_once_at(4, probe_module.encode_batch)
    monkeypatch.setattr(probe_module, "encode_batch", failing)
    probe = GradientProbe.from_settings({"grad_probe_every": 1}, objective)
    faulted = probe.measure(model, list(model.parameters()), images, tokens)
    assert calls["failed"] == 1 and all(p.grad is None for p in model.parameters())
    assert faulted.pop("memory_fallback") == {"what": "probe pairs per forward", "requested": 4, "used": 2,
                                              "halvings": [[4, 2]]}
    assert faulted.keys() == expected.keys() and "memory_fallback" not in expected
    for key, value in expected.items():  # the same sums in another order: equal up to float rounding
        if isinstance(value, float):
            assert faulted[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
        else:
            assert faulted[key] == value, key
    again = probe.measure(model, list(model.parameters()), images, tokens, with_bf16=False)  # size kept
    assert calls["failed"] == 1 and again["memory_fallback"]["used"] == 2 and again["memory_fallback"]["halvings"] == []
