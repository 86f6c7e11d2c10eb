"""The machinery baselines in the training loop: their auxiliary inputs, per-group learning rates,
the logit-scale clamp, checkpoint/resume of an extra module, and compute-batch mode's identity."""
import copy
import json
import math

import pytest
import torch
import yaml
from helpers.training import EVALUATION, EXECUTION, SPEC

from hnclip.auxiliary.edges import EdgeSettings, build_edges
from hnclip.auxiliary.lism import LismSettings, backbone_encoders, build_lism
from hnclip.auxiliary.segments import CpuSegmenter
from hnclip.io import read_jsonl, write_jsonl
from hnclip.models.factory import create
from hnclip.training.loop import TrainJob, train
from hnclip.training.schedule import build_optimizer


@pytest.fixture(scope="module")
def frameworks(project_root) -> dict:
    return yaml.safe_load((project_root / "params.yaml").read_text())["frameworks"]


@pytest.fixture(scope="module")
def auxiliary(tiny_data, tmp_path_factory) -> dict:
    """LISM segments and edge maps of the tiny training set, built as the auxiliary rules do."""
    out = tmp_path_factory.mktemp("aux")
    torch.manual_seed(0)
    encoders = backbone_encoders(create("hnclip-tiny"))
    build_lism(tiny_data["train"], out / "segments", CpuSegmenter(), encoders, LismSettings())
    build_edges(tiny_data["train"], out / "segments" / "segments.jsonl", out / "edges", EdgeSettings())
    return {"segments": out / "segments" / "segments.jsonl", "edges": out / "edges" / "edges.jsonl"}


def baseline_job(tiny_data, out, framework, settings, auxiliary, gamma=0.0, recipe=None, execution=None):
    spec = copy.deepcopy(SPEC)
    spec["objective"] = {"framework": framework, "gamma": gamma, "lambda_tok": 0.0, "margin": "live",
                         "settings": settings}
    spec["recipe"].update({"epochs": 1, **(recipe or {})})  # one epoch: 3 optimizer steps are enough here
    return TrainJob(run_id=f"{framework}-run", spec=spec, spec_hash="b" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution={**EXECUTION, **(execution or {})}, evaluation=EVALUATION, auxiliary=auxiliary)


@pytest.mark.parametrize("framework, terms", [("finelip", {"fine"}), ("goal", {"org", "seg", "patch", "text"}),
                                              ("structxlip", {"g", "sc", "rs", "lsc"})])
def test_each_baseline_trains_and_logs_its_terms(tiny_data, tmp_path, frameworks, auxiliary, framework, terms):
    record = train(baseline_job(tiny_data, tmp_path, framework, frameworks[framework], auxiliary, gamma=0.5))
    assert record["optimizer_steps"] == 3 and record["training"]["framework"] == framework
    steps = read_jsonl(tmp_path / "run" / "steps.jsonl")
    assert {f"{t}_mean" for t in terms | {"infonce", "hn", "total"}} <= set(steps[0])
    assert all(math.isfinite(s["total_mean"]) for s in steps)
    # evaluation exports a plain CLIP: the saved weights hold no extra module
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)["state_dict"]
    assert set(saved) == set(create("hnclip-tiny").model.state_dict())


def test_released_cost_steps_are_recorded_and_change_no_weight(tiny_data, tmp_path, frameworks, auxiliary):
    """A run's spec holds no cost-only setting; the job says which it pays (the timed run), the record says so."""
    settings = {k: v for k, v in frameworks["goal"].items() if k not in ("double_forward", "anomaly_detection")}
    weights, records = [], []
    for paid in (False, True):
        out = tmp_path / str(paid)
        costs = {"double_forward": paid, "anomaly_detection": paid}
        records.append(train(baseline_job(tiny_data, out, "goal", settings, auxiliary,
                                          execution={"cost_only_settings": costs})))
        weights.append(torch.load(out / "run" / "model.pt", weights_only=True)["state_dict"])
    assert [r["training"]["released_costs"]["double_forward"] for r in records] == [False, True]
    for name, value in weights[0].items():
        other = weights[1][name]
        if name.endswith("attn.in_proj_bias"):
            # the key bias has a mathematically zero gradient (softmax ignores it): AdamW turns its float
            # noise into +-lr steps that change no output, so compare the query and value biases only
            width = value.shape[0] // 3
            value, other = torch.cat([value[:width], value[2 * width:]]), torch.cat([other[:width], other[2 * width:]])
        error = float((other - value).norm() / value.norm().clamp_min(1e-12))
        assert error < 1e-4, (name, error)


def test_finelip_module_trains_at_its_own_rate(tiny_data, tmp_path, frameworks, auxiliary):
    job = baseline_job(tiny_data, tmp_path, "finelip", frameworks["finelip"], auxiliary,
                       recipe={"lr": 1e-4, "module_lr": 1e-2})
    groups = {g["name"]: g for g in train(job)["training"]["param_groups"]}
    assert groups["module"]["base_lr"] == 1e-2 and groups["backbone"]["base_lr"] == 1e-4
    assert groups["module"]["parameters"] > 0


def test_optimizer_groups_and_decay_all():
    model = create("hnclip-tiny").model
    extra = torch.nn.Linear(4, 4)
    optimizer = build_optimizer(model, {"lr": 2e-6, "weight_decay": 0.01, "module_lr": 2e-4}, extra)
    by_name = {g["name"]: g for g in optimizer.param_groups}
    assert by_name["backbone_no_decay"]["weight_decay"] == 0.0 and by_name["backbone"]["weight_decay"] == 0.01
    assert by_name["module"]["lr"] == 2e-4 and set(by_name["module"]["params"]) == set(extra.parameters())
    decay_all = build_optimizer(model, {"lr": 5e-6, "weight_decay": 0.05, "decay_all": True})
    assert [g["name"] for g in decay_all.param_groups] == ["backbone"]
    assert decay_all.param_groups[0]["weight_decay"] == 0.05


def test_structxlip_clamps_the_logit_scale_after_every_step(tiny_data, tmp_path, frameworks, auxiliary):
    train(baseline_job(tiny_data, tmp_path, "structxlip", frameworks["structxlip"], auxiliary))
    scales = [s["logit_scale"] for s in read_jsonl(tmp_path / "run" / "steps.jsonl")]
    assert max(scales) <= math.exp(3.5) + 1e-4  # the recipe resets s to 100; the clamp brings it to <= 33.1


@pytest.mark.parametrize("framework", ["goal", "structxlip"])
def test_baseline_inputs_loaded_by_workers_train_the_same_weights(tiny_data, tmp_path, frameworks, auxiliary,
                                                                   framework):
    """GOAL's and StructXLIP's micro-batches (dataclasses of segment crops, edge maps, filtered captions)
    are pure functions of their indices: loaded in two worker processes they train what the main process does."""
    inline, pooled = (train(baseline_job(tiny_data, tmp_path / str(workers), framework, frameworks[framework],
                                         auxiliary, gamma=0.5, execution={"loader_workers": workers}))
                      for workers in (0, 2))
    assert pooled["final_weights_sha256"] == inline["final_weights_sha256"]
    assert [h["eval"] for h in pooled["history"]] == [h["eval"] for h in inline["history"]]


def test_goal_images_without_segment_fall_back_to_themselves(tiny_data, tmp_path, frameworks, auxiliary):
    rows = read_jsonl(auxiliary["segments"])
    for row in rows[:5]:
        row.update(segment=None, matches=[], no_segment="no_segments")
    crops_dir = auxiliary["segments"].parent
    edited = crops_dir / "segments.fallback.jsonl"  # beside the crops it names
    write_jsonl(edited, rows)
    record = train(baseline_job(tiny_data, tmp_path, "goal", frameworks["goal"], {"segments": edited}))
    assert record["training"]["method"] == {"images_without_segment": 5, "images": len(rows)}


def test_checkpoint_holds_and_restores_the_extra_module(tmp_path):
    from hnclip.training.frameworks import TrainedModel
    first = TrainedModel.build(create("hnclip-tiny").model, "finelip")
    first.attach(torch.nn.Linear(4, 4))
    second = TrainedModel.build(create("hnclip-tiny").model, "finelip")
    second.attach(torch.nn.Linear(4, 4))
    assert not torch.equal(first.extra.weight, second.extra.weight)
    second.restore(first.checkpoint_state(), tmp_path / "last.pt")
    assert torch.equal(first.extra.weight, second.extra.weight)
    assert set(first.trainable_parameters()) >= set(first.extra.parameters())


def test_missing_auxiliary_rows_are_refused_with_the_fix(tiny_data, tmp_path, frameworks, auxiliary):
    rows = read_jsonl(auxiliary["edges"])[:-1]
    short = auxiliary["edges"].parent / "edges.short.jsonl"
    write_jsonl(short, rows)
    with pytest.raises(ValueError, match="has no row for 1 training image.*rebuild it"):
        train(baseline_job(tiny_data, tmp_path, "structxlip", frameworks["structxlip"], {"edges": short}))


def test_compute_batch_is_recorded_and_matches_micro_batches(tiny_data, tmp_path):
    micro = train(TrainJob(run_id="m", spec=SPEC, spec_hash="c" * 64, init_kind="scratch", init_path=None,
                           model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                           eval_manifests={"docci": tiny_data["test"]}, out_dir=tmp_path / "m" / "run",
                           checkpoint_dir=tmp_path / "m" / "ckpt", execution=EXECUTION, evaluation=EVALUATION))
    whole = train(TrainJob(run_id="c", spec=SPEC, spec_hash="c" * 64, init_kind="scratch", init_path=None,
                           model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                           eval_manifests={"docci": tiny_data["test"]}, out_dir=tmp_path / "c" / "run",
                           checkpoint_dir=tmp_path / "c" / "ckpt",
                           execution={**EXECUTION, "compute_batch": 16}, evaluation=EVALUATION))
    assert micro["training"]["compute_batch"] == 8 and micro["training"]["batch_mode"] == "micro"
    assert whole["training"]["compute_batch"] == 16 and whole["training"]["batch_mode"] == "compute"
    a = json.loads(json.dumps(micro["history"][-1]["eval"]))
    b = json.loads(json.dumps(whole["history"][-1]["eval"]))
    assert a["docci"]["t2i"] == pytest.approx(b["docci"]["t2i"], abs=1e-6)
    steps_micro = read_jsonl(tmp_path / "m" / "run" / "steps.jsonl")
    steps_whole = read_jsonl(tmp_path / "c" / "run" / "steps.jsonl")
    for x, y in zip(steps_micro, steps_whole, strict=True):
        assert y["total_mean"] == pytest.approx(x["total_mean"], rel=1e-4)


def test_initial_evaluation_is_computed_once_per_initial_weights(tiny_data, tmp_path, monkeypatch):
    import hnclip.training.loop as loop
    calls = []
    real = loop.evaluate_all
    monkeypatch.setattr(loop, "evaluate_all", lambda *a, **k: calls.append(1) or real(*a, **k))
    spec = copy.deepcopy(SPEC)
    spec["recipe"]["epochs"] = 1

    def job(name, seed):
        return TrainJob(run_id=name, spec={**spec, "seed": seed}, spec_hash=name * 64, init_kind="scratch",
                        init_path=None, model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                        eval_manifests={"docci": tiny_data["test"]}, out_dir=tmp_path / name / "run",
                        checkpoint_dir=tmp_path / name / "ckpt", execution=EXECUTION, evaluation=EVALUATION,
                        eval_cache_dir=tmp_path / "cache")
    torch.manual_seed(0)
    first = train(job("a", 7))  # scratch init is seeded by the run's seed: same seed, same initial weights
    second = train(job("b", 7))
    assert first["initial_eval"] == second["initial_eval"]
    assert len(calls) == 2 + 1  # one initial evaluation, one per epoch and run
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1


def test_finelip_trains_on_its_released_schedule(tiny_data, tmp_path, frameworks, auxiliary):
    """The trainer reads FineLIP's schedule from the run's first micro-batch of each step, counted over the whole
    run: 48 pairs, micro-batch 8 x 2 -> 6 micro-batches and 3 steps per epoch, 2 epochs. With a 3-micro-batch
    warm-up and K = 12 / 2 = 6: step 0 at base, then f(k) for k = 1, 3, 5, 7, 9 = 2/3, 1, 1/4, 1/4, 1."""
    settings = {**frameworks["finelip"], "num_patches": None, "lr_schedule": "released", "warmup_micro_steps": 3}
    job = baseline_job(tiny_data, tmp_path, "finelip", settings, auxiliary,
                       recipe={"epochs": 2, "lr": 1e-4, "module_lr": 1e-2, "decay_all": True})
    record = train(job)
    lrs = [s["lr"] / 1e-4 for s in read_jsonl(tmp_path / "run" / "steps.jsonl")]
    assert lrs == pytest.approx([1.0, 2 / 3, 1.0, 0.25, 0.25, 1.0], abs=1e-9)
    groups = {g["name"]: g for g in record["training"]["param_groups"]}
    assert set(groups) == {"backbone", "module"}            # weight decay on every parameter, as released
    assert groups["backbone"]["weight_decay"] == groups["module"]["weight_decay"] == 0.01


def test_structxlip_weights_follow_the_0_based_epoch(tiny_data, tmp_path, frameworks, auxiliary):
    """Each logged step's total is L_g + the weights of its own 0-based epoch times the terms (epochs 0 and 1
    weigh alike, so a second epoch whose weights came from epoch 2 would show)."""
    from hnclip.losses.structxlip import structxlip_weights
    settings = {**frameworks["structxlip"], "weights": [0.5, 0.25, 0.25], "decay_epochs": 1}
    train(baseline_job(tiny_data, tmp_path, "structxlip", settings, auxiliary, recipe={"epochs": 2}))
    steps = read_jsonl(tmp_path / "run" / "steps.jsonl")
    assert [s["epoch"] for s in steps] == [1, 1, 1, 2, 2, 2]
    assert structxlip_weights(1, (0.5, 0.25, 0.25), (0.7, 0.5, 0.4), 1) != structxlip_weights(
        2, (0.5, 0.25, 0.25), (0.7, 0.5, 0.4), 1)
    for step in steps:
        weights = structxlip_weights(step["epoch"] - 1, (0.5, 0.25, 0.25), tuple(settings["floors"]), 1)
        want = step["g_mean"] + sum(weights[t] * step[f"{t}_mean"] for t in ("sc", "rs", "lsc"))
        assert step["total_mean"] == pytest.approx(want, rel=1e-6, abs=1e-7), step["epoch"]


def test_params_state_the_released_settings(project_root, frameworks):
    """params.yaml's release settings: GOAL's equal `GoalSettings()` (the release's defaults), FineLIP trains in
    fp32 with weight decay 0.01 on every parameter on every profile, its corrected recipe on one cosine."""
    from hnclip.config.registry import method_recipe
    from hnclip.losses.goal import GoalSettings
    params = yaml.safe_load((project_root / "params.yaml").read_text())
    goal = dict(frameworks["goal"])
    assert goal.pop("anomaly_detection") is True                # the trainer's, not the loss's
    assert GoalSettings.from_dict(goal) == GoalSettings()
    assert frameworks["finelip"]["lr_schedule"] == "released" and frameworks["finelip"]["warmup_micro_steps"] == 200
    for profile in ("tiny", "paper"):
        for name in ("finelip", "finelip_hn", "finelip_corrected", "finelip_corrected_hn"):
            recipe = method_recipe(params["profiles"][profile]["recipe"], params["methods"][name])
            assert (recipe["precision"], recipe["decay_all"], recipe["weight_decay"]) == ("fp32", True, 0.01), name
    assert params["methods"]["finelip_corrected"]["settings"] == {"lr_schedule": "cosine"}
    assert params["methods"]["goal_corrected"]["settings"]["box_scale"] == "center_crop"


@pytest.mark.parametrize("framework", ["goal", "structxlip", "finelip"])
def test_out_of_memory_falls_back_to_activation_checkpointing_with_the_same_gradient(
        tiny_data, tmp_path, frameworks, auxiliary, framework, monkeypatch):
    """Fault injection: step 1 runs out of memory unless the towers checkpoint their activations; the
    step is retried with checkpointing on, its gradient is the one the plain step gives, the record says so."""
    import hnclip.training.loop as loop
    from hnclip.training.faults import FAULTS_ENV

    def run(name: str) -> tuple[dict, list]:
        captured, real = [], loop.gradient_norm
        monkeypatch.setattr(loop, "gradient_norm", lambda model: captured.append(
            [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]) or real(model))
        record = train(baseline_job(tiny_data, tmp_path / name, framework, frameworks[framework], auxiliary,
                                    gamma=0.5))
        return record, captured

    reference, reference_grads = run("reference")
    monkeypatch.setenv(FAULTS_ENV, json.dumps({"oom": {"step": 1, "needs_checkpointing": True}}))
    record, grads = run("fallback")
    assert reference["training"]["memory_fallbacks"] == [] and not reference["training"]["activation_checkpointing"]
    assert record["training"]["memory_fallbacks"] == [{"step": 1, "activation_checkpointing": [False, True]}]
    assert record["training"]["activation_checkpointing"] is True and record["optimizer_steps"] == 3
    for reference_step, fallback_step in zip(reference_grads[:2], grads[:2], strict=True):
        assert len(reference_step) == len(fallback_step)
        for a, b in zip(reference_step, fallback_step, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
