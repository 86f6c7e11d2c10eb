"""params.yaml -> RunSpecs: content-addressed ids, deduplication across tables, schema rejections."""
import copy

import pytest

from hnclip.config.params import ParamsError, validate_params
from hnclip.config.registry import Registry


@pytest.mark.parametrize("profile, seeds", [("tiny", [42]), ("tiny_seeds", [42, 43])])
def test_committed_params_validate_and_expand(params, in_project, profile, seeds):
    reg = Registry(params, profile=profile)
    cells = reg.cells("table3a")
    gammas, benchmarks = params["tables"]["table3a"]["vary"]["gamma"], params["tables"]["table3a"]["benchmarks"]
    assert reg.table_seeds("table3a") == seeds and len(cells) == len(gammas) * len(benchmarks) * len(seeds)
    # DCI and Long-DCI are evaluated on the same DCI-trained runs: 3 training sets, not 4.
    train_sets = {params["benchmarks"][bench]["train"] for bench in benchmarks}
    assert len(train_sets) == 3 and len({c.run_id for c in cells}) == len(gammas) * len(train_sets) * len(seeds)
    assert len({(c.run_id, c.benchmark) for c in cells}) == len(cells)


def test_seed_profile_adds_only_second_seed_runs(params, in_project):
    """`tiny_seeds` is `tiny` plus seed 43 on Tables 1 and 3a-c: every tiny run is shared."""
    tiny, seeds = Registry(params, profile="tiny"), Registry(params, profile="tiny_seeds")
    assert set(tiny.runs()) < set(seeds.runs())
    assert all(run.spec["seed"] == 43 for run_id, run in seeds.runs().items() if run_id not in tiny.runs())


def _runs(reg, table, row, benchmark=None, seed=42):
    return {c.run_id for c in reg.cells(table)
            if c.row == row and c.seed == seed and (benchmark is None or c.benchmark == benchmark)}


def test_identical_cells_in_several_tables_are_one_run(params, in_project):
    reg = Registry(params)
    hn_clip = _runs(reg, "table1", "hn_clip")
    assert len(hn_clip) == 3  # one run per training set (docci, dci, vg)
    assert _runs(reg, "table3a", "gamma=0.5") == hn_clip
    assert _runs(reg, "table3c", "recomputed") == hn_clip
    assert _runs(reg, "table3b", "tok=1,hn=1") <= hn_clip
    assert _runs(reg, "tableA9", "docci/100%/hn_clip") == _runs(reg, "table1", "hn_clip", "docci")
    seeds = Registry(params, profile="tiny_seeds")
    assert _runs(seeds, "tableA8", "hn_clip/seed=43", seed=43) == _runs(seeds, "table3a", "gamma=0.5", "long_dci", 43)
    # gamma=0 with the token term is the same experiment as the "+L_tok" ablation row
    assert _runs(reg, "table3a", "gamma=0", "dci") == _runs(reg, "table3b", "tok=1,hn=0", "dci")
    # A cross-domain cell reuses the in-domain run: evaluation differs, training does not
    assert _runs(reg, "tableA10", "docci->dci/hn_clip") == _runs(reg, "table1", "hn_clip", "docci")
    assert len(reg.runs()) < sum(len({c.run_id for c in reg.cells(t) if c.run_id}) for t in reg.tables)


def test_gradient_probes_only_on_the_runs_the_gradient_figures_draw(params, in_project):
    reg = Registry(params)
    every = reg.profile["execution"]["grad_probe_every"]
    fig4 = _runs(reg, "table1", "hn_clip", "docci")
    rows = set(params["figures"]["figA8_gradient_dynamics_scales"]["rows"])  # HN-CLIP rows of Table A9
    figA8 = {c.run_id for c in reg.cells("tableA9") if c.run_id and c.row in rows}
    assert figA8 and not any("-goal-" in run for run in figA8)
    probed = {run_id for run_id in reg.runs() if reg.probe_every(run_id)}
    assert probed == fig4 | figA8 and all(reg.probe_every(r) == every for r in probed)
    assert reg.probe_every(next(iter(_runs(reg, "table3a", "gamma=0.25", "docci")))) == 0
    everything = copy.deepcopy(params)
    everything["profiles"]["tiny"]["execution"]["grad_probe_runs"] = "all"
    reg_all = Registry(everything)
    assert {r for r in reg_all.runs() if reg_all.probe_every(r) == every} == set(reg_all.runs())


def test_zeroshot_row_and_baseline_runs(params, in_project):
    reg = Registry(params)
    zeroshot = {c.run_id for c in reg.cells("table1") if c.row == "longclip_zeroshot"}
    assert zeroshot == {reg.zeroshot_id()} and reg.zeroshot_id() not in reg.runs()
    assert all(run for run, _ in reg.evaluations())
    goal = reg.run(next(c.run_id for c in reg.cells("table1") if c.row == "goal"))
    assert goal.run_id.startswith(f"{goal.train_set}-goal-g0-")
    # the framework's protocol settings (but its cost-only ones) and auxiliary-input settings are part
    # of the run's identity
    cost_only = {"double_forward", "anomaly_detection"}
    assert goal.spec["objective"]["settings"] == {k: v for k, v in params["frameworks"]["goal"].items()
                                                  if k not in cost_only}
    assert set(goal.spec["auxiliary"]) == {"segments"}
    assert set(reg.auxiliary_inputs(goal.run_id)) == {"segments"}
    structx = reg.run(next(c.run_id for c in reg.cells("table1") if c.row == "structxlip"))
    assert set(reg.auxiliary_inputs(structx.run_id)) == {"segments", "edges"}
    finelip = reg.run(next(c.run_id for c in reg.cells("table1") if c.row == "finelip"))
    base_lr = reg.profile["recipe"]["lr"]
    assert finelip.spec["recipe"]["lr"] == base_lr * 0.5 and finelip.spec["recipe"]["module_lr"] == base_lr * 100
    assert reg.auxiliary_inputs(finelip.run_id) == {}


def test_method_settings_override_the_framework_and_change_the_run(params, in_project):
    reg = Registry(params)
    released = reg.run_spec("docci", params["methods"]["goal"], 42, register=False)
    fixed = reg.run_spec("docci", params["methods"]["goal_corrected"], 42, register=False)
    assert released.run_id != fixed.run_id
    assert fixed.spec["objective"]["settings"]["patch_size_bug"] is False
    assert fixed.spec["objective"]["settings"]["seg_weight"] == params["frameworks"]["goal"]["seg_weight"]


def test_optional_tables_are_planned_only_on_request(params, in_project):
    assert "baselines_corrected" not in Registry(params).tables
    with_optional = Registry({**params, "optional_tables": True})
    assert "baselines_corrected" in with_optional.tables
    assert len(with_optional.runs()) > len(Registry(params).runs())


def test_compute_batch_is_not_part_of_a_run(params, in_project):
    other = copy.deepcopy(params)
    other["profiles"][other["profile"]]["recipe"]["compute_batch"] = 128
    assert set(Registry(params).runs()) == set(Registry(other).runs())


def test_released_costs_are_paid_by_the_timed_run_only(params, in_project):
    """GOAL's double forward and anomaly detection change no weight (tests/test_goal_loss.py): not part of
    a run's identity, executed by the run Table A3 times and by no other, unless execution says `all`."""
    other = copy.deepcopy(params)
    other["frameworks"]["goal"].update(double_forward=False, anomaly_detection=False)
    reg = Registry(params)
    assert set(reg.runs()) == set(Registry(other).runs())
    timed = reg.timed_runs()["goal"]
    goal_runs = [r for r, run in reg.runs().items() if run.spec["objective"]["framework"] == "goal"]
    assert timed in goal_runs and len(goal_runs) > 5
    assert all("double_forward" not in reg.run(r).spec["objective"]["settings"] for r in goal_runs)
    costs = {r: reg.released_costs(r) for r in goal_runs}
    assert costs[timed] == {"double_forward": True, "anomaly_detection": True}
    assert all(c == {"double_forward": False, "anomaly_detection": False} for r, c in costs.items() if r != timed)
    assert reg.released_costs(reg.timed_runs()["hn_clip"]) == {}
    everywhere = copy.deepcopy(params)
    everywhere["profiles"][everywhere["profile"]]["execution"]["released_costs"] = "all"
    assert all(Registry(everywhere).released_costs(r)["double_forward"] for r in goal_runs)
    corrected = Registry({**params, "optional_tables": True})  # the bugs-fixed GOAL is timed without them
    assert not any(corrected.released_costs(corrected.timed_runs()["goal_corrected"]).values())


def test_run_id_is_readable_and_content_addressed(params, in_project):
    reg = Registry(params)
    run = reg.run(reg.cells("table3a")[0].run_id)
    assert run.run_id.startswith(f"{run.train_set}-g0-tok1-live-f1-s")
    assert run.spec_hash.startswith(run.run_id.rsplit("-", 1)[1])
    # Labels and execution settings are not part of a run's identity...
    params["methods"]["hn_clip"]["label"] = "renamed"
    params["profiles"]["tiny"]["execution"]["threads"] = 7
    assert set(Registry(params).runs()) == set(reg.runs())
    # ...but anything that changes the trained weights is.
    params["profiles"]["tiny"]["recipe"]["lr"] = 3e-4
    assert not set(Registry(params).runs()) & set(reg.runs())


def test_changing_one_gamma_changes_only_that_row(params, in_project):
    before = Registry(params)
    params["tables"]["table3a"]["vary"]["gamma"][1] = 0.3
    after = Registry(params)
    changed = {c.row for c in after.cells("table3a")} ^ {c.row for c in before.cells("table3a")}
    assert changed == {"gamma=0.25", "gamma=0.3"}
    new_runs = set(after.runs()) - set(before.runs())
    train_sets = {params["benchmarks"][bench]["train"] for bench in params["tables"]["table3a"]["benchmarks"]}
    assert len(new_runs) == len(train_sets) * len(after.table_seeds("table3a"))
    assert all("-g0.3-" in run for run in new_runs)


def test_paper_profile_expands_without_data(params, in_project):
    reg = Registry(params, profile="paper")
    assert reg.table_seeds("table3a") == [42]
    assert len({c.run_id for c in reg.cells("table3a")}) == 15
    assert all(r.spec["init"]["backbone"] == "longclip_l" for r in reg.runs().values())


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["tables"]["table3a"]["vary"].update(gamma=[-0.5]), r"tables\.table3a\.vary\.gamma\.0: -0\.5 is less than the minimum of 0"),  # noqa: E501
    (lambda p: p["methods"]["hn_clip"].update(fraction=1.5), r"methods\.hn_clip\.fraction: 1\.5 is greater than the maximum of 1"),  # noqa: E501
    (lambda p: p["methods"]["hn_clip"].update(fraction=0), r"methods\.hn_clip\.fraction: 0 is less than or equal to the minimum of 0"),  # noqa: E501
    (lambda p: p["profiles"]["tiny"]["datasets"].update(coco={"kind": "synthetic"}), r"profiles\.tiny\.datasets: 'coco' is not one of \['docci', 'dci', 'vg', 'urban1k'\]"),  # noqa: E501
    (lambda p: p["profiles"]["tiny"]["recipe"].pop("lr"), r"profiles\.tiny\.recipe: 'lr' is a required property"),
    (lambda p: p["profiles"]["tiny"]["recipe"].update(epochs="ten"), r"profiles\.tiny\.recipe\.epochs: 'ten' is not of type 'integer'"),  # noqa: E501
    (lambda p: p["methods"]["hn_clip"].update(g_source="stale"), r"methods\.hn_clip\.g_source: 'stale' is not one of \['live', 'frozen'\]"),  # noqa: E501
    (lambda p: p["profiles"]["tiny"]["datasets"]["docci"].update(variant="coco"), r"profiles\.tiny\.datasets\.docci\.variant: 'coco' is not one of"),  # noqa: E501
    (lambda p: p["profiles"]["tiny"]["recipe"].update(lr_typo=1), r"profiles\.tiny\.recipe: Additional properties are not allowed.*allowed keys"),  # noqa: E501
])
def test_schema_rejects_malformed_params(params, in_project, mutate, message):
    mutate(params)
    with pytest.raises(ParamsError, match=message):
        validate_params(params)


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["tables"]["table3a"].update(method="hn_clap"), r"tables\.table3a: unknown method 'hn_clap'; allowed values: \["),  # noqa: E501
    (lambda p: p["tables"]["table3a"]["benchmarks"].append("coco"), r"tables\.table3a\.benchmarks\.4: unknown benchmark 'coco'"),  # noqa: E501
    (lambda p: p.update(profile="huge"), r"profile: unknown profile 'huge'; allowed values: \['paper', 'paper_rehearsal', 'tiny', 'tiny_seeds'\]"),  # noqa: E501
    (lambda p: p["profiles"]["tiny"].update(backbone="vit_h"), r"backbone: unknown backbone 'vit_h'"),
    (lambda p: p["methods"]["goal"].update(settings={"patch_bug": False}),
     r"methods\.goal\.settings: unknown key\(s\) \['patch_bug'\] for the goal framework"),
])
def test_registry_rejects_unknown_references(params, in_project, mutate, message):
    mutate(params)
    with pytest.raises(ParamsError, match=message):
        Registry(params)


def test_cli_validate_fails_before_any_job(empty_project, params, capsys):
    import yaml

    from hnclip.cli import main
    params["tables"]["table3a"]["vary"]["gamma"] = [0.5, -1]
    (empty_project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["validate"]) == 2
    assert "tables.table3a.vary.gamma.1" in capsys.readouterr().err
