"""params.yaml -> RunSpecs: content-addressed ids, deduplication across tables, schema rejections."""
import copy

import pytest

from hnclip.config import ParamsError, validate_params
from hnclip.registry import Registry


def test_committed_params_validate_and_expand(params, in_project):
    reg = Registry(params)
    cells = reg.cells("table3a")
    seeds = params["profiles"]["tiny"]["seeds"]
    assert len(cells) == 5 * 4 * len(seeds)
    # DCI and Long-DCI are evaluated on the same DCI-trained runs: 3 training sets, not 4.
    assert len(reg.runs()) == 5 * 3 * len(seeds)
    assert len(reg.evaluations()) == len(cells)


def test_identical_cells_in_two_tables_are_one_run(params, in_project):
    params["tables"]["table1_like"] = {
        "title": "t", "benchmarks": ["docci", "urban1k"], "directions": ["t2i"], "metrics": ["R@1"],
        "selection": "best", "rows": [{"key": "HN-CLIP", "method": "hn_clip"}, {"key": "FT", "method": "longclip_ft"}]}
    reg = Registry(params)
    sweep = {c.run_id for c in reg.cells("table3a") if c.row == "gamma=0.5"}
    hn = {c.run_id for c in reg.cells("table1_like") if c.row == "HN-CLIP"}
    assert hn <= sweep
    before = len(Registry(copy.deepcopy({**params, "tables": {"table3a": params["tables"]["table3a"]}})).runs())
    # Only the Long-CLIP-FT cells (gamma=0, no token term) are new runs.
    assert len(reg.runs()) == before + 2 * len(params["profiles"]["tiny"]["seeds"])


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
    same = set(after.runs()) & set(before.runs())
    assert len(same) == len(before.runs()) - 3 * len(params["profiles"]["tiny"]["seeds"])


def test_paper_profile_expands_without_data(params, in_project):
    reg = Registry(params, profile="paper")
    assert len(reg.runs()) == 15 and all(r.spec["init"]["backbone"] == "longclip_l" for r in reg.runs().values())


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["tables"]["table3a"]["vary"].update(gamma=[-0.5]), r"tables\.table3a\.vary\.gamma\.0: -0\.5 is less than the minimum of 0"),
    (lambda p: p["methods"]["hn_clip"].update(fraction=1.5), r"methods\.hn_clip\.fraction: 1\.5 is greater than the maximum of 1"),
    (lambda p: p["methods"]["hn_clip"].update(fraction=0), r"methods\.hn_clip\.fraction: 0 is less than or equal to the minimum of 0"),
    (lambda p: p["profiles"]["tiny"]["datasets"].update(coco={"kind": "synthetic"}), r"profiles\.tiny\.datasets: 'coco' is not one of \['docci', 'dci', 'vg', 'urban1k'\]"),
    (lambda p: p["profiles"]["tiny"]["recipe"].pop("lr"), r"profiles\.tiny\.recipe: 'lr' is a required property"),
    (lambda p: p["profiles"]["tiny"]["recipe"].update(epochs="ten"), r"profiles\.tiny\.recipe\.epochs: 'ten' is not of type 'integer'"),
    (lambda p: p["methods"]["hn_clip"].update(margin="stale"), r"methods\.hn_clip\.margin: 'stale' is not one of \['live', 'frozen'\]"),
    (lambda p: p["profiles"]["tiny"]["datasets"]["docci"].update(variant="coco"), r"profiles\.tiny\.datasets\.docci\.variant: 'coco' is not one of"),
    (lambda p: p["profiles"]["tiny"]["recipe"].update(lr_typo=1), r"profiles\.tiny\.recipe: Additional properties are not allowed.*allowed keys"),
])
def test_schema_rejects_malformed_params(params, in_project, mutate, message):
    mutate(params)
    with pytest.raises(ParamsError, match=message):
        validate_params(params)


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["tables"]["table3a"].update(method="hn_clap"), r"tables\.table3a: unknown method 'hn_clap'; allowed values: \["),
    (lambda p: p["tables"]["table3a"]["benchmarks"].append("coco"), r"tables\.table3a\.benchmarks\.4: unknown benchmark 'coco'"),
    (lambda p: p.update(profile="huge"), r"profile: unknown profile 'huge'; allowed values: \['paper', 'tiny'\]"),
    (lambda p: p["profiles"]["tiny"].update(backbone="vit_h"), r"backbone: unknown backbone 'vit_h'"),
])
def test_registry_rejects_unknown_references(params, in_project, mutate, message):
    mutate(params)
    with pytest.raises(ParamsError, match=message):
        Registry(params)


def test_cli_validate_fails_before_any_job(tmp_path, params, in_project):
    import yaml

    from hnclip.cli import main
    params["tables"]["table3a"]["vary"]["gamma"] = [0.5, -1]
    bad = in_project / "tests" / f".bad-params-{tmp_path.name}.yaml"
    bad.write_text(yaml.safe_dump(params))
    try:
        assert main(["--params", str(bad), "validate"]) == 2
    finally:
        bad.unlink()
