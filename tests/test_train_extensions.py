"""Training-loop extensions: LoRA/DoRA runs (adapter-only training and checkpoints, merged model.pt,
resume after SIGKILL), precision recording, exact large-batch groups (GradCache) and the
gradient probe of paper Fig. 4."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.training import EVALUATION, EXECUTION, SPEC, run_with_faults

from hnclip.data.loader import PairDataset
from hnclip.evaluation.retrieval import evaluate_model
from hnclip.hashing import weights_digest
from hnclip.losses import hn_loss, infonce_loss, token_alignment_loss
from hnclip.losses.objective import TOKEN_LOSS_CHUNK
from hnclip.models.adapters import load_adapter_state_dict
from hnclip.models.factory import create, load_weights
from hnclip.models.towers import encode_batch, encode_text
from hnclip.training.exact_batch import exact_batch_backward
from hnclip.training.frameworks import TrainedModel
from hnclip.training.loop import TrainJob, train
from hnclip.training.model_setup import frozen_text_encoder
from hnclip.training.probe import GradientProbe

ADAPTER_TARGETS = ("attn.in_proj_weight", "attn.out_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def make_job(tiny_data, out: Path, objective=None, recipe=None, execution=None):
    spec = {**SPEC, "objective": {**SPEC["objective"], **(objective or {})},
            "recipe": {**SPEC["recipe"], **(recipe or {})}}
    return TrainJob(run_id="ext-run", spec=spec, spec_hash="e" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    # these tests read the finished run's resume checkpoint (adapters, probe state)
                    execution={**EXECUTION, "keep_resume_checkpoints": True, **(execution or {})},
                    evaluation=EVALUATION)



def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def initial_base(job: TrainJob) -> torch.nn.Module:
    """The scratch init a run starts from (train() seeds, then builds the model)."""
    torch.manual_seed(job.spec["seed"])
    return create(job.model_config).model


def adapted_model(job: TrainJob) -> torch.nn.Module:
    """The unmerged adapted model at the end of a run: base + the final checkpoint's adapters."""
    base = initial_base(job)
    with torch.no_grad():
        base.logit_scale.fill_(torch.tensor(job.spec["recipe"]["reset_logit_scale"]).log())
    trained = TrainedModel.build(base, job.spec["objective"]["framework"], job.spec["recipe"].get("adapter"))
    payload = torch.load(job.checkpoint_dir / "last.pt", weights_only=True)
    load_adapter_state_dict(trained.module, payload["adapter"])
    return trained.module


def assert_adapter_run(job: TrainJob, record: dict) -> None:
    """Only adapters trained and checkpointed; model.pt is a strictly loadable merged CLIP whose
    recall equals the adapted model's and the training record's."""
    payload = torch.load(job.checkpoint_dir / "last.pt", weights_only=True)
    assert "model" not in payload and payload["base_weights_sha256"]
    assert payload["adapter"] and all("lora_" in key for key in payload["adapter"])

    merged = load_weights(job.out_dir / "model.pt")  # strict: plain open_clip keys
    base = initial_base(job).state_dict()
    for key, value in merged.model.state_dict().items():
        if key == "logit_scale":
            continue  # reset to ln(100) at the start, then frozen
        changed = not torch.equal(value, base[key])
        assert changed == key.endswith(ADAPTER_TARGETS), key  # frozen base, adapted Linears
    assert float(merged.model.logit_scale.detach().exp()) == pytest.approx(100.0)

    data = PairDataset.from_manifest(job.eval_manifests["docci"], merged.preprocess, merged.tokenizer)
    ks, tie = EVALUATION["recall_ks"], EVALUATION["tie_rule"]
    from_file = evaluate_model(merged.model, data, ks, tie)
    from_adapters = evaluate_model(adapted_model(job), data, ks, tie)
    for direction in ("t2i", "i2t"):
        for k, value in from_file[direction].items():
            assert from_adapters[direction][k] == pytest.approx(value, abs=1e-5)
    assert from_file == record["history"][-1]["eval"]["docci"]


# ---- LoRA / DoRA ---------------------------------------------------------------------------------
def test_lora_run_trains_adapters_and_resumes_after_kill(tiny_data, tmp_path):
    objective, probe = {"framework": "lora"}, {"grad_probe_every": 2}
    reference_job = make_job(tiny_data, tmp_path / "uninterrupted", objective, execution=probe)
    reference = train(reference_job)
    assert reference["training"]["framework"] == "lora"
    assert_adapter_run(reference_job, reference)

    job = make_job(tiny_data, tmp_path / "killed", objective, execution=probe)
    proc = run_with_faults(job, {"kill_after_step": 5})
    assert proc.returncode == -9, proc.stderr
    assert torch.load(job.checkpoint_dir / "last.pt", weights_only=True)["state"]["step"] == 4
    resumed = train(job)
    assert resumed["resumed_from_step"] == 4
    assert [h["weights_sha256"] for h in resumed["history"]] == [h["weights_sha256"] for h in reference["history"]]
    # model.pt bytes differ (torch.save names the archive after the temporary file); its weights do not
    assert weights_digest(load_weights(job.out_dir / "model.pt").model) == reference["final_weights_sha256"]
    # probe records of steps 0 and 2 come back from the checkpoint, step 4 is measured again
    assert read_jsonl(job.out_dir / "grad_probe.jsonl") == read_jsonl(reference_job.out_dir / "grad_probe.jsonl")


def test_dora_run_with_frozen_margin_and_bf16_request(tiny_data, tmp_path):
    job = make_job(tiny_data, tmp_path, {"framework": "dora", "margin": "frozen"},
                   {"precision": "bf16", "adapter": {"r": 4, "alpha": 8, "dropout": 0.0, "target": "both"}},
                   {"grad_probe_every": 3})
    record = train(job)
    probes = read_jsonl(job.out_dir / "grad_probe.jsonl")  # probed w.r.t. the adapters, with frozen G
    assert [(r["step"], r["margin"]) for r in probes] == [(0, "frozen"), (3, "frozen")]
    adapter_entries = sum(v.numel() for v in torch.load(job.checkpoint_dir / "last.pt",
                                                        weights_only=True)["adapter"].values())
    assert all(r["parameters"] == adapter_entries and r["hn_grad_norm"] > 0 for r in probes)
    assert record["training"]["framework"] == "dora"
    assert record["training"]["precision"] == {"requested": "bf16", "effective": "fp32"}  # no autocast on CPU
    assert_adapter_run(job, record)
    assert all(value.shape[0] == 4 for key, value in
               torch.load(job.checkpoint_dir / "last.pt", weights_only=True)["adapter"].items() if "lora_A" in key)


def test_adapter_checkpoint_refuses_another_base(tmp_path):
    torch.manual_seed(0)
    first = TrainedModel.build(create("hnclip-tiny").model, "lora")
    torch.manual_seed(1)
    second = TrainedModel.build(create("hnclip-tiny").model, "lora")
    with pytest.raises(RuntimeError, match="different base weights"):
        second.restore(first.checkpoint_state(), tmp_path / "ckpt" / "last.pt")
    with pytest.raises(ValueError, match="unknown framework"):
        TrainedModel.build(create("hnclip-tiny").model, "sparse_lora")


# ---- exact large batch ---------------------------------------------------------------------------
@pytest.mark.parametrize("objective", [
    {"gamma": 0.5, "lambda_tok": 1.0, "g_source": "live"},
    {"gamma": 0.5, "lambda_tok": 0.0, "g_source": "frozen"},
    {"gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"},
], ids=["hn_tok", "hn_frozen", "infonce"])
def test_exact_batch_gradient_equals_full_batch_gradient(tiny_data, objective):
    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    model = backbone.model.train()
    frozen = frozen_text_encoder(model)
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    images, tokens = data.batch(range(16))
    micro_batches = [(images[i:i + 4], tokens[i:i + 4]) for i in range(0, 16, 4)]

    record = exact_batch_backward(model, micro_batches, objective, frozen)
    exact = {name: p.grad.clone() for name, p in model.named_parameters()}

    model.zero_grad(set_to_none=True)  # reference: one 16-pair contrastive batch, token term per micro-batch
    encoded = encode_batch(model, images, tokens, with_tokens=False)
    scale = model.logit_scale.exp()
    margin = encode_text(frozen, tokens).detach() if objective["g_source"] == "frozen" else None
    global_loss = hn_loss(encoded.image_features, encoded.text_features, scale, objective["gamma"], margin) \
        if objective["gamma"] > 0 else infonce_loss(encoded.image_features, encoded.text_features, scale)
    total = global_loss
    if objective["lambda_tok"] > 0:
        token_losses = []
        for part_images, part_tokens in micro_batches:
            part = encode_batch(model, part_images, part_tokens, with_tokens=True)
            token_losses.append(token_alignment_loss(part.image_tokens, part.text_tokens, part.text_padding_mask,
                                                     model.logit_scale.exp(), chunk_size=TOKEN_LOSS_CHUNK))
        total = total + objective["lambda_tok"] * sum(token_losses) / len(token_losses)
        assert record["tok"] == pytest.approx(float(sum(token_losses).detach()) / len(token_losses), abs=1e-5)
    total.backward()

    assert record["total"] == pytest.approx(float(total.detach()), abs=1e-5)
    assert record["micro_batches"] == 4 and record["infonce"] > 0
    for name, param in model.named_parameters():
        torch.testing.assert_close(exact[name], param.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


# ---- gradient probe ------------------------------------------------------------------------------
def test_probe_measures_both_losses_without_side_effects(tiny_data):
    torch.manual_seed(0)
    backbone = create("hnclip-tiny")
    model = backbone.model.train()
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    images, tokens = data.batch(range(8))
    probe = GradientProbe.from_settings({"grad_probe_every": 3},
                                        {"framework": "full", "gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"})
    assert (probe.gamma, probe.gamma_source) == (0.5, "default")
    assert GradientProbe.from_settings({}, SPEC["objective"]) is None
    assert [probe.due(step) for step in range(4)] == [True, False, False, True]
    every_other = GradientProbe.from_settings({"grad_probe_every": 3, "grad_probe_bf16_every": 2}, SPEC["objective"])
    assert [step for step in range(13) if every_other.bf16_due(step)] == [0, 6, 12]  # probes 0, 2 and 4
    never = GradientProbe.from_settings({"grad_probe_every": 1, "grad_probe_bf16_every": 0}, SPEC["objective"])
    assert not any(never.bf16_due(step) for step in range(5))

    rng = torch.get_rng_state()
    record = probe.measure(model, list(model.parameters()), images, tokens)
    assert all(p.grad is None for p in model.parameters()) and torch.equal(rng, torch.get_rng_state())

    encoded = encode_batch(model, images, tokens, with_tokens=False)
    scale = model.logit_scale.exp()
    clip = infonce_loss(encoded.image_features, encoded.text_features, scale)
    assert record["clip_loss"] == float(clip.detach())  # the same arithmetic, bit for bit
    assert record["hn_loss"] == float(hn_loss(encoded.image_features, encoded.text_features, scale, 0.5).detach())
    clip.backward()
    # float64 accumulation: an fp32 norm over 3.6M entries is off by ~1e-5 relative
    expected_norm = float(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().norm())
    assert record["clip_grad_norm"] == pytest.approx(expected_norm, rel=1e-12)
    assert 0 < record["clip_max_abs_dlogit"] <= 1 and 0 < record["hn_max_abs_dlogit"] <= 1  # |p - y| / B
    assert record["exactly_zero_norms"] == 0 and -1 <= record["grad_cosine"] <= 1
    assert record["clip_bf16_grad_exactly_zero"] is False and record["clip_bf16_loss"] > 0  # CPU: bf16 autocast

    skipped = probe.measure(model, list(model.parameters()), images, tokens, with_bf16=False)
    assert {k: v for k, v in skipped.items() if k.startswith("clip_bf16_")} == {
        "clip_bf16_loss": None, "clip_bf16_grad_norm": None, "clip_bf16_grad_exactly_zero": None,
        "clip_bf16_max_abs_dlogit": None}
    assert {k: v for k, v in skipped.items() if not k.startswith("clip_bf16_")} == \
        {k: v for k, v in record.items() if not k.startswith("clip_bf16_")}


def test_probe_records_and_identical_training_in_exact_batch_mode(tiny_data, tmp_path):
    recipe = {"exact_batch": True}
    probed_job = make_job(tiny_data, tmp_path / "probed", recipe=recipe,
                          execution={"grad_probe_every": 2, "grad_probe_bf16_every": 2})
    probed = train(probed_job)
    plain = train(make_job(tiny_data, tmp_path / "plain", recipe=recipe))
    assert probed["final_weights_sha256"] == plain["final_weights_sha256"]  # the probe changes nothing
    assert [h["weights_sha256"] for h in probed["history"]] == [h["weights_sha256"] for h in plain["history"]]

    records = read_jsonl(probed_job.out_dir / "grad_probe.jsonl")
    assert [r["step"] for r in records] == [0, 2, 4] and [r["epoch"] for r in records] == [1, 1, 2]
    for r in records:
        assert r["clip_loss"] > 0 and r["hn_loss"] > 0 and r["batch"] == SPEC["recipe"]["micro_batch"]
        assert r["clip_grad_norm"] >= 0 and r["hn_grad_norm"] >= 0 and -1 <= r["grad_cosine"] <= 1
        assert 0 <= r["clip_zero_grad_fraction"] <= 1 and 0 <= r["hn_zero_grad_fraction"] <= 1
        assert r["clip_max_abs_dlogit"] >= 0 and r["hn_max_abs_dlogit"] >= 0
        assert (r["gamma"], r["gamma_source"], r["exactly_zero_norms"]) == (0.5, "objective", 0)
    assert [r["clip_bf16_grad_exactly_zero"] is not None for r in records] == [True, False, True]  # every 2nd probe
    assert probed["training"]["grad_probe"]["measurements"] == 3
    assert probed["training"]["grad_probe"]["bf16_every"] == 2
    assert torch.load(probed_job.checkpoint_dir / "last.pt", weights_only=True)["state"]["grad_probe"] == records
    assert not (tmp_path / "plain" / "run" / "grad_probe.jsonl").exists()

    steps = read_jsonl(probed_job.out_dir / "steps.jsonl")
    assert {(s["batch_mode"], s["contrastive_batch"]) for s in steps} == {("exact", 16)}
    assert probed["history"][0]["train"]["micro_batches"] == 6
