"""Table X1's controls beyond the paper: the constant and the shuffled margin (by hand, and equal on every
path that computes L_HN: micro-batch, compute_batch, exact batch, the gradient probe), a shuffled-G run
that resumes to the same weights, the exact-zero L_CLIP gradients in fp32 vs bf16 autocast on a
constructed saturated batch, the table's runs and plan (existing run ids unchanged), and its report."""
from __future__ import annotations

import contextlib
import copy
import json

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers.batches import accumulation_group as random_group
from helpers.batches import tiny_model
from helpers.micro_project import ROOT, VENV_BIN, run
from helpers.training import EVALUATION, EXECUTION, SPEC, run_with_faults

from hnclip.cli import main
from hnclip.config import objective_keys, paths
from hnclip.config.params import ParamsError, validate_params
from hnclip.config.registry import Registry
from hnclip.data.loader import PairDataset
from hnclip.losses import constant_margins, hn_loss, margin_matrix, shuffled_margins
from hnclip.losses.objective import loss_terms, shuffle_generator, with_run_seed
from hnclip.models.factory import create
from hnclip.models.towers import encode_batch
from hnclip.report import build
from hnclip.report.gradient_stats import exact_zero_shares
from hnclip.training.batching import epoch_micro_batches
from hnclip.training.compute_batch import compute_batch_backward
from hnclip.training.exact_batch import exact_batch_backward
from hnclip.training.loop import TrainJob, train
from hnclip.training.probe import GradientProbe, infonce_gradient

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny shapes, one thread

MICRO, ACCUM = 4, 4
CONSTANT = {"framework": "full", "gamma": 0.5, "lambda_tok": 0.0, "g_source": "live", "margin_control": "constant"}
SHUFFLED = with_run_seed({**CONSTANT, "margin_control": "shuffled"}, 7)
CONTROL_ROWS = ("constant_margin", "shuffled_g", "longclip_ft_128way", "hn_clip_128way")



def unit(rows: list[list[float]]) -> torch.Tensor:
    return F.normalize(torch.tensor(rows, dtype=torch.float64), dim=-1)


# ---- the two margin matrices, by hand ------------------------------------------------------------
def test_constant_margin_is_the_mean_off_diagonal_margin_by_hand():
    # three captions: cos(0,1) = 0.6, cos(0,2) = 0, cos(1,2) = 0.8; gamma 0.5 -> margins 0.3, 0, 0.4
    text = unit([[1, 0, 0], [0.6, 0.8, 0], [0, 1, 0]])
    assert margin_matrix(text, 0.5) == pytest.approx(torch.tensor([[0, .3, 0], [.3, 0, .4], [0, .4, 0]],
                                                                   dtype=torch.float64))
    mean = (0.3 + 0 + 0.4) * 2 / 6  # over the 6 off-diagonal entries
    expected = torch.full((3, 3), mean, dtype=torch.float64).fill_diagonal_(0)
    torch.testing.assert_close(margin_matrix(text, 0.5, "constant"), expected)
    # L_HN with it: the logits s * (S + mean) off the diagonal, by hand
    image = unit([[1, 0.1, 0], [0.2, 1, 0], [0, 0.3, 1]])
    sims = image @ text.t()
    logits = 10.0 * (sims + expected)
    targets = torch.arange(3)
    by_hand = (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2
    torch.testing.assert_close(hn_loss(image, text, 10.0, 0.5, margin_control="constant"), by_hand)
    assert not torch.allclose(hn_loss(image, text, 10.0, 0.5), by_hand)  # G_bar itself is another loss


def test_shuffled_margins_permute_the_pairs_by_hand():
    text = unit([[1, 0, 0, 0], [0.6, 0.8, 0, 0], [0, 1, 0, 0], [0.5, 0.5, 0.5, 0.5]])
    margins = margin_matrix(text, 0.5)
    order = torch.randperm(6, generator=torch.Generator().manual_seed(3))
    upper = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]  # torch.triu_indices' order
    expected = torch.zeros(4, 4, dtype=torch.float64)
    for (i, j), source in zip(upper, order.tolist()):
        expected[i, j] = expected[j, i] = margins[upper[source]]
    shuffled = shuffled_margins(margins, torch.Generator().manual_seed(3))
    torch.testing.assert_close(shuffled, expected)
    assert not torch.equal(shuffled, margins)
    torch.testing.assert_close(margin_matrix(text, 0.5, "shuffled", torch.Generator().manual_seed(3)), expected)


def test_shuffled_margins_keep_the_margins_and_the_masked_diagonal():
    text = F.normalize(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    margins = margin_matrix(text, 0.5)
    shuffled = margin_matrix(text, 0.5, "shuffled", torch.Generator().manual_seed(1))
    off = ~torch.eye(16, dtype=torch.bool)
    assert torch.equal(shuffled.diagonal(), torch.zeros(16)) and torch.equal(shuffled, shuffled.t())
    assert torch.equal(shuffled[off].sort().values, margins[off].sort().values)  # the same multiset
    assert (shuffled != margins)[off].float().mean() > 0.9  # ...on other pairs
    again = margin_matrix(text, 0.5, "shuffled", torch.Generator().manual_seed(1))
    assert torch.equal(shuffled, again)
    assert not torch.equal(shuffled, margin_matrix(text, 0.5, "shuffled", torch.Generator().manual_seed(2)))
    with pytest.raises(ValueError, match="generator"):
        margin_matrix(text, 0.5, "shuffled")
    assert torch.equal(constant_margins(margins).diagonal(), torch.zeros(16))


def test_the_shuffle_of_a_group_is_a_function_of_the_run_seed_and_its_position():
    text = F.normalize(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)), dim=-1)

    def shuffled(objective, key):
        return margin_matrix(text, 0.5, "shuffled", shuffle_generator(objective, key))
    reference = shuffled(SHUFFLED, (1, 3))
    assert torch.equal(reference, shuffled(SHUFFLED, (1, 3)))
    for objective, key in ((SHUFFLED, (1, 4)), (SHUFFLED, (2, 3)), (with_run_seed(SHUFFLED, 8), (1, 3))):
        assert not torch.equal(reference, shuffled(objective, key))
    assert shuffle_generator(CONSTANT, (1, 3)) is None and shuffle_generator({**SHUFFLED, "gamma": 0.0}, None) is None
    assert "run_seed" not in with_run_seed(CONSTANT, 7)
    with pytest.raises(ValueError, match="run seed"):
        shuffle_generator(SHUFFLED, None)


# ---- every path that computes L_HN ---------------------------------------------------------------
def accumulation_group(seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return random_group(MICRO, ACCUM, seed)


def grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


KEYS = [(1, 8 + k) for k in range(ACCUM)]  # the second optimizer step of epoch 1 (0-based) at accumulation 4


@pytest.mark.parametrize("objective", [CONSTANT, SHUFFLED], ids=["constant", "shuffled"])
def test_micro_batch_and_compute_batch_paths_give_the_same_losses_and_gradients(tiny_state, objective):
    batches = accumulation_group()
    model = tiny_model(tiny_state)
    micro = []
    for (images, tokens), key in zip(batches, KEYS):
        terms = loss_terms(model, images, tokens, objective, shuffle_key=key)
        (terms["total"] / len(batches)).backward()
        micro.append(float(terms["hn"].detach()))
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    records = compute_batch_backward(model, batches, objective, None, contextlib.nullcontext, lambda r: None,
                                     MICRO * ACCUM, MICRO, shuffle_keys=KEYS)
    assert [r["hn"] for r in records] == pytest.approx(micro, rel=1e-5)
    for name, grad in expected.items():
        assert float((grads(model)[name] - grad).norm() / grad.norm()) <= 1e-5, name
    # the control is in effect: G_bar itself gives other losses
    plain = {k: v for k, v in objective.items() if k not in ("margin_control", "run_seed")}
    assert float(loss_terms(model, *batches[0], plain)["hn"].detach()) != pytest.approx(micro[0], rel=1e-4)
    if objective is SHUFFLED:  # and another group's shuffle gives another loss
        assert float(loss_terms(model, *batches[0], objective, shuffle_key=(1, 0))["hn"].detach()) != \
            pytest.approx(micro[0], rel=1e-4)
        with pytest.raises(ValueError, match="shuffle key"):
            loss_terms(model, *batches[0], objective)


@pytest.mark.parametrize("objective", [CONSTANT, SHUFFLED], ids=["constant", "shuffled"])
def test_exact_batch_is_one_softmax_with_the_groups_controlled_margins(tiny_state, objective):
    batches = accumulation_group()
    model = tiny_model(tiny_state)
    record = exact_batch_backward(model, batches, objective, shuffle_key=KEYS[0])
    exact = grads(model)
    model.zero_grad(set_to_none=True)
    images, tokens = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    encoded = encode_batch(model, images, tokens, with_tokens=False)
    reference = hn_loss(encoded.image_features, encoded.text_features, model.logit_scale.exp(), 0.5,
                        margin_control=objective["margin_control"], generator=shuffle_generator(objective, KEYS[0]))
    reference.backward()
    assert record["hn"] == pytest.approx(float(reference.detach()), rel=1e-5)
    for name, grad in grads(model).items():
        torch.testing.assert_close(exact[name], grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("objective", [CONSTANT, SHUFFLED], ids=["constant", "shuffled"])
def test_the_probe_measures_the_runs_controlled_margin(tiny_state, objective):
    images, tokens = accumulation_group()[0]
    model = tiny_model(tiny_state)
    probe = GradientProbe.from_settings({"grad_probe_every": 1}, objective)
    record = probe.measure(model, list(model.parameters()), images, tokens, shuffle_key=KEYS[0])
    trained = loss_terms(model, images, tokens, objective, shuffle_key=KEYS[0])
    assert record["hn_loss"] == float(trained["hn"].detach()) and record["margin_control"] == probe.margin_control
    # the record states every objective key it was measured with, by its identity name
    assert {name: record[name] for name in objective_keys.record(objective)} == objective_keys.record(objective)
    assert record["margin"] == "live" and record["framework"] == "full"
    assert record["clip_loss"] == float(trained["infonce"].detach())
    assert record["clip_bf16_loss"] == pytest.approx(record["clip_loss"], rel=0.05)  # bf16 autocast on the CPU
    assert record["clip_bf16_grad_exactly_zero"] is False and record["clip_grad_norm_fp32"] > 0


# ---- a shuffled-G run is reproducible and resumable ------------------------------------------------
def make_job(tiny_data, out, control: str = "shuffled") -> TrainJob:
    spec = {**SPEC, "objective": {**SPEC["objective"], "margin_control": control}}
    return TrainJob(run_id="control-run", spec=spec, spec_hash="f" * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / "run", checkpoint_dir=out / "ckpt",
                    execution={**EXECUTION, "grad_probe_every": 2}, evaluation=EVALUATION)


def test_a_shuffled_g_run_killed_and_resumed_reaches_the_same_weights(tiny_data, tmp_path):
    """The shuffles are drawn from (seed, epoch, micro-batch), not from a generator's stream: the step
    replayed after a resume (checkpoints every 2 steps, killed after step 3) draws the same ones."""
    whole_job = make_job(tiny_data, tmp_path / "whole")
    whole = train(whole_job)
    job = make_job(tiny_data, tmp_path / "killed")
    proc = run_with_faults(job, {"kill_after_step": 3})
    assert proc.returncode == -9, proc.stderr
    resumed = train(job)
    assert resumed["resumed_from_step"] == 2
    assert [h["weights_sha256"] for h in resumed["history"]] == [h["weights_sha256"] for h in whole["history"]]
    probes = [json.loads(line) for line in (whole_job.out_dir / "grad_probe.jsonl").read_text().splitlines()]
    assert {r["margin_control"] for r in probes} == {"shuffled"} and len(probes) == 3
    assert (job.out_dir / "grad_probe.jsonl").read_text() == (whole_job.out_dir / "grad_probe.jsonl").read_text()
    constant = train(make_job(tiny_data, tmp_path / "constant", control="constant"))
    assert constant["final_weights_sha256"] != whole["final_weights_sha256"]  # the controls train differently


def test_a_shuffled_g_run_trains_on_the_shuffles_of_its_micro_batches_positions(tiny_data, tmp_path):
    """Step 1's logged L_HN is the mean over its micro-batches of L_HN with the shuffle of (seed, epoch 0,
    micro-batch k), in micro-batch and in compute_batch mode; the probe measures micro-batch 0's."""
    train(make_job(tiny_data, tmp_path / "micro"))
    job = make_job(tiny_data, tmp_path / "compute")
    job.execution = {**job.execution, "compute_batch": 16}
    assert train(job)["training"]["batch_mode"] == "compute"
    torch.manual_seed(SPEC["seed"])  # the loop's scratch initialisation, logit scale reset
    backbone = create("hnclip-tiny")
    model = backbone.model.train()
    with torch.no_grad():
        model.logit_scale.fill_(torch.tensor(SPEC["recipe"]["reset_logit_scale"]).log())
    data = PairDataset.from_manifest(tiny_data["train"], backbone.preprocess, backbone.tokenizer)
    first_group = epoch_micro_batches(list(range(len(data))), SPEC["recipe"]["micro_batch"], SPEC["seed"], 0)[:2]
    objective = with_run_seed(make_job(tiny_data, tmp_path).spec["objective"], SPEC["seed"])
    with torch.no_grad():
        hn = [float(loss_terms(model, *data.batch(ix), objective, shuffle_key=(0, k))["hn"])
              for k, ix in enumerate(first_group)]
        unkeyed = float(loss_terms(model, *data.batch(first_group[0]), objective, shuffle_key=(0, 1))["hn"])
    assert unkeyed != pytest.approx(hn[0], rel=1e-4)  # the key matters on this batch
    for out in (tmp_path / "micro", tmp_path / "compute"):
        steps = [json.loads(line) for line in (out / "run" / "steps.jsonl").read_text().splitlines()]
        assert steps[0]["hn_mean"] == pytest.approx(sum(hn) / 2, rel=1e-5)
        probe = json.loads((out / "run" / "grad_probe.jsonl").read_text().splitlines()[0])
        assert probe["hn_loss"] == pytest.approx(hn[0], rel=1e-6)


# ---- exact-zero L_CLIP gradients: fp32 vs bf16 autocast -------------------------------------------
def saturated_batch(gap: float, n: int = 16, dim: int = 32) -> torch.Tensor:
    """n unit vectors whose pairwise cosine is 1 - gap (a shared direction plus private ones): used as
    both image and text features, every positive beats every negative by gap in cosine."""
    shared = torch.zeros(dim)
    shared[0] = 1
    private = torch.zeros(n, dim)
    private[torch.arange(n), torch.arange(1, n + 1)] = 1
    return (1 - gap) ** 0.5 * shared + gap ** 0.5 * private


@pytest.mark.parametrize("gap, zero_loss, zero_norm_fp32, zero_fp32, zero_bf16", [
    (0.1, False, False, False, False),  # logit gap 10 at s = 100: nothing vanishes
    (0.3, True, False, False, False),   # the fp32 loss is exactly 0, its gradient is ~1e-10
    (0.7, True, True, False, False),    # the fp32 norm underflows (entries ~1e-28), the gradient does not
    (0.95, True, True, False, True),    # under bf16 autocast every entry is exactly 0; in fp32 none is
])
def test_exact_zeros_of_the_infonce_gradient_on_a_saturated_batch(gap, zero_loss, zero_norm_fp32, zero_fp32,
                                                                   zero_bf16):
    features = saturated_batch(gap)
    weight = torch.nn.Parameter(torch.eye(features.shape[1]))

    def forward():
        projected = F.normalize(features @ weight, dim=-1)
        return projected, projected, torch.tensor(100.0)
    fp32, bf16 = infonce_gradient(forward, [weight], "fp32"), infonce_gradient(forward, [weight], "bf16")
    assert (fp32["loss"] == 0.0, fp32["grad_norm_fp32"] == 0.0) == (zero_loss, zero_norm_fp32)
    assert (fp32["grad_exactly_zero"], bf16["grad_exactly_zero"]) == (zero_fp32, zero_bf16)
    assert fp32["grad_norm"] > 0  # float64 accumulation: the fp32 gradient never vanishes here
    rows = [{"clip_loss": fp32["loss"], "clip_grad_norm_fp32": fp32["grad_norm_fp32"],
             "clip_grad_exactly_zero": fp32["grad_exactly_zero"],
             "clip_bf16_grad_exactly_zero": bf16["grad_exactly_zero"]}, {"clip_loss": 1.0}]  # an older row
    shares = exact_zero_shares(rows)
    assert shares["zero_loss_fp32"] == (0.5 if zero_loss else 0.0, 2)
    assert shares["zero_grad_bf16"] == (float(zero_bf16), 1)


# ---- the table: runs, identities, plan, report ----------------------------------------------------
def test_table_x1_expands_to_its_cells_and_adds_its_controls_runs(params, in_project, capsys):
    reg = Registry(params)
    cells = reg.cells("tableX1")
    table = params["tables"]["tableX1"]
    assert len(cells) == len(table["rows"]) * len(table["benchmarks"]) and \
        {c.benchmark for c in cells} == {"docci", "dci"}
    without = copy.deepcopy(params)
    without["profiles"]["tiny"]["optional_tables"] = []
    before = Registry(without)
    assert "tableX1" not in before.tables and set(before.runs()) < set(reg.runs())
    new = set(reg.runs()) - set(before.runs())
    # a run per control and training set (DOCCI's, DCI's); the pages' counts of them: tests/test_docs.py
    assert new == {c.run_id for c in cells if c.row in CONTROL_ROWS} and len(new) == len(CONTROL_ROWS) * 2
    readable = {c.row: c.run_id.rsplit("-", 1)[0] for c in cells if c.benchmark == "docci"}
    assert readable == {"longclip_ft": "docci-g0-tok0-live-f1-s42", "hn_clip": "docci-g0.5-tok1-live-f1-s42",
                        "constant_margin": "docci-g0.5-tok1-live-constant-f1-s42",
                        "shuffled_g": "docci-g0.5-tok1-live-shuffled-f1-s42",
                        "longclip_ft_128way": "docci-g0-tok0-live-exact-f1-s42",
                        "hn_clip_128way": "docci-g0.5-tok1-live-exact-f1-s42"}
    hn_clip = {c.run_id for c in reg.cells("table1") if c.row == "hn_clip"}
    assert {c.run_id for c in cells if c.row == "hn_clip"} <= hn_clip  # the paper's runs, shared
    shuffled = reg.run(next(c.run_id for c in cells if c.row == "shuffled_g"))
    assert shuffled.spec["objective"]["margin_control"] == "shuffled"
    assert reg.run(next(c.run_id for c in cells if c.row == "hn_clip_128way")).spec["recipe"]["exact_batch"] is True
    assert all(reg.probe_every(c.run_id) for c in reg.probe_cells("tableX1"))  # already Fig. 4 / A8's runs
    assert main(["runs", "--table", "tableX1"]) == 0
    assert sorted(capsys.readouterr().out.split()[-12:]) == sorted({c.run_id for c in cells})


def test_existing_runs_keep_their_ids(params, in_project):
    """A method without the new keys (or with their defaults) has the id it had: absent keys add nothing."""
    reg = Registry(params)
    for spec in reg.runs().values():
        if "-constant-" not in spec.run_id and "-shuffled-" not in spec.run_id:
            assert "margin_control" not in spec.spec["objective"], spec.run_id
        if "-exact-" not in spec.run_id:
            assert "exact_batch" not in spec.spec["recipe"], spec.run_id
    hn_clip = params["methods"]["hn_clip"]
    same = reg.run_spec("docci", {**hn_clip, "margin_control": "none"}, 42, register=False)
    assert same.run_id == reg.run_spec("docci", hn_clip, 42, register=False).run_id
    # at gamma 0 there is no margin to control: the same experiment as plain InfoNCE
    ft = params["methods"]["longclip_ft"]
    assert reg.run_spec("docci", {**ft, "margin_control": "shuffled"}, 42, register=False).run_id == \
        reg.run_spec("docci", ft, 42, register=False).run_id


def test_the_paper_profile_plans_table_x1_only_on_request(params, in_project):
    paper = Registry(params, profile="paper")
    assert "tableX1" not in paper.tables
    assert all(not params["tables"][t].get("optional") for t in paper.tables)  # the paper's own runs
    only = Registry({**params, "optional_tables": ["tableX1"]}, profile="paper")
    assert "tableX1" in only.tables and "baselines_corrected" not in only.tables
    # it adds exactly the controls' runs: its HN-CLIP and Long-CLIP FT rows are the paper's runs
    controls = {c.run_id for c in only.cells("tableX1") if c.row in CONTROL_ROWS}
    assert set(only.runs()) - set(paper.runs()) == controls and set(paper.runs()) <= set(only.runs())
    everything = Registry({**params, "optional_tables": True}, profile="paper")
    assert {"tableX1", "baselines_corrected"} <= set(everything.tables)
    with pytest.raises(ParamsError, match=r"optional_tables: \['table1'\] are not optional tables"):
        Registry({**params, "optional_tables": ["table1"]}, profile="paper")


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["methods"]["hn_clip"].update(margin_control="random"), r"methods\.hn_clip\.margin_control"),
    (lambda p: p["methods"]["hn_clip"].update(recipe_overrides={"exact_batch": "yes"}),
     r"methods\.hn_clip\.recipe_overrides\.exact_batch"),
    (lambda p: p.update(optional_tables="tableX1"), r"optional_tables"),
])
def test_the_schema_rejects_malformed_controls(params, in_project, mutate, message):
    mutate(params)
    with pytest.raises(ParamsError, match=message):
        validate_params(params)


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["methods"]["goal_hn"].update(margin_control="constant"),
     r"methods\.goal_hn: margin_control is available for the frameworks \['full', 'lora', 'dora'\] only"),
    (lambda p: p["methods"]["goal"].update(recipe_overrides={"exact_batch": True}),
     r"methods\.goal: recipe_overrides\.exact_batch"),
    (lambda p: p["tables"]["tableX1"].update(probe_rows=["hn_clap"]), r"tables\.tableX1\.probe_rows: \['hn_clap'\]"),
])
def test_the_registry_rejects_controls_it_cannot_train(params, in_project, mutate, message):
    mutate(params)
    with pytest.raises(ParamsError, match=message):
        Registry(params)


def test_snakemake_plans_table_x1_on_the_tiny_profile_and_on_request_on_the_paper_profile(tmp_path):
    for name in ("Snakefile", "params.yaml"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "workflow").symlink_to(ROOT / "workflow")
    tiny = run(f"{VENV_BIN}/snakemake -n --cores 4", tmp_path).stdout
    paper = run(f"{VENV_BIN}/snakemake -n --cores 4 --config profile=paper 'optional_tables=[tableX1]'",
                tmp_path).stdout
    for plan in (tiny, paper):
        assert "results/tables/tableX1.md" in plan and "results/effects/tableX1.md" in plan
        assert "-live-shuffled-f1-s42-" in plan and "-live-constant-f1-s42-" in plan and "-exact-f1-s42-" in plan


def fake_evaluation(run_id: str, benchmark: str, r1: float) -> dict:
    entry = {"epoch": 1, "metrics": {d: {"R@1": r1, "R@5": r1 + 5, "R@10": r1 + 8} for d in ("t2i", "i2t")}}
    return {"run_id": run_id, "benchmark": benchmark, "best": entry, "last": entry, "per_epoch": [entry]}


def test_the_table_reports_the_controls_and_the_probes_exact_zeros(params, in_project, tmp_path, monkeypatch):
    reg = Registry(params)
    monkeypatch.chdir(tmp_path)
    for i, cell in enumerate(reg.cells("tableX1")):
        path = paths.evaluation(cell.run_id, cell.benchmark)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fake_evaluation(cell.run_id, cell.benchmark, 50.0 + i)))
    probed = {c.benchmark: c.run_id for c in reg.probe_cells("tableX1")}
    assert set(probed) == {"docci", "dci"}
    rows = [{"clip_loss": 0.0 if i < 3 else 0.5, "clip_grad_norm_fp32": 0.0 if i < 2 else 1e-3,
             "clip_grad_exactly_zero": False, "clip_bf16_grad_exactly_zero": i == 0} for i in range(4)]
    log = paths.run_dir(probed["docci"]) / "grad_probe.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))  # the DCI run's log is missing
    build.build_table(reg, "tableX1")
    frame = pd.read_csv(paths.table("tableX1", "csv"))
    probes = frame[frame["direction"] == "none"].set_index(["benchmark", "metric"])
    assert probes.loc[("docci", "zero_loss_fp32"), "ours_mean"] == 75.0
    assert probes.loc[("docci", "zero_norm_fp32"), "ours_mean"] == 50.0
    assert probes.loc[("docci", "zero_grad_fp32"), "ours_mean"] == 0.0
    assert probes.loc[("docci", "zero_grad_bf16"), "ours_mean"] == 25.0
    assert probes.loc[("docci", "probes"), "ours_mean"] == 4 and (probes.loc["dci", "status"] == "not probed").all()
    r1 = frame[(frame["metric"] == "R@1") & (frame["direction"] == "t2i")].set_index(["row", "benchmark"])
    assert set(r1.index.get_level_values("row")) == {"longclip_ft", "hn_clip", *CONTROL_ROWS}
    assert r1["paper"].isna().all()  # the paper runs none of these
    md = paths.table("tableX1", "md").read_text()
    assert "| HN-CLIP, constant margin |" in md and "| HN-CLIP, 128-way softmax |" in md
    assert "∇ ≡ 0 (bf16 autocast)" in md and "| HN-CLIP, DOCCI run | 4 | 75.0 | 50.0 | 0.0 | 25.0 |" in md
    assert "| HN-CLIP, DCI run | not probed |" in md
    tex = paths.table("tableX1", "tex").read_text()
    assert tex.count(r"\begin{tabular}") == 2 and "bf16 autocast" in tex
    record = json.loads(paths.table("tableX1", "provenance.json").read_text())
    assert f"probe:{probed['docci']}" in record["inputs"]


def test_with_two_seeds_each_probed_run_has_its_own_row(params, in_project, tmp_path, monkeypatch):
    """tiny_seeds probes the HN-CLIP run of each seed: one band row per run, named by its seed."""
    reg = Registry({**params, "profile": "tiny_seeds"})
    monkeypatch.chdir(tmp_path)
    for cell in reg.cells("tableX1"):
        path = paths.evaluation(cell.run_id, cell.benchmark)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fake_evaluation(cell.run_id, cell.benchmark, 50.0 + cell.seed - 42)))
    probed = reg.probe_cells("tableX1")
    assert sorted((c.benchmark, c.seed) for c in probed) == [("dci", 42), ("dci", 43), ("docci", 42), ("docci", 43)]
    for cell in probed:  # seed 42: one probe with a zero fp32 loss out of 2; seed 43: none out of 3
        rows = [{"clip_loss": 0.0 if (cell.seed == 42 and i == 0) else 0.5, "clip_grad_norm_fp32": 1e-3,
                 "clip_grad_exactly_zero": False, "clip_bf16_grad_exactly_zero": False}
                for i in range(2 if cell.seed == 42 else 3)]
        log = paths.run_dir(cell.run_id) / "grad_probe.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    build.build_table(reg, "tableX1")
    md = paths.table("tableX1", "md").read_text()
    assert "| HN-CLIP, DOCCI run, seed 42 | 2 | 50.0 | 0.0 | 0.0 | 0.0 |" in md
    assert "| HN-CLIP, DOCCI run, seed 43 | 3 | 0.0 | 0.0 | 0.0 | 0.0 |" in md
    assert "| HN-CLIP, DCI run, seed 43 | 3 |" in md
    r1 = pd.read_csv(paths.table("tableX1", "csv")).query("metric == 'R@1' and direction == 't2i'")
    assert set(r1["n_seeds"]) == {2} and set(r1["ours_mean"] - r1["ours_min"]) == {0.5}


def test_the_committed_params_validate_with_the_controls(params):
    validate_params(params)
    assert yaml.safe_load((ROOT / "params.yaml").read_text())["profiles"]["tiny"]["optional_tables"] == ["tableX1"]
