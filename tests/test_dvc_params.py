"""The DVC stage reruns when a value that can change an output changes, and not for how jobs execute:
dvc.yaml lists params.yaml's keys but each profile's execution settings (device, threads, loader workers,
batch sizes, checkpoint cadence and retention) and the cost plan's `planning`, keeping the execution keys
the runs' records contain (the `train` rule's params)."""
from __future__ import annotations

import json
import shutil

import yaml
from helpers.micro_project import ROOT

# execution keys whose value a run's records contain: workflow/rules/train.smk passes them as params
RECORDED_EXECUTION_KEYS = ("grad_probe_every", "grad_probe_bf16_every", "grad_probe_runs", "grad_probe_precision",
                           "released_costs")
EXECUTION_ONLY_SECTIONS = ("planning",)


def output_keys(params: dict) -> list[str]:
    """Every key of `params` that can change an output, in the file's order (DVC's dotted names)."""
    keys = []
    for top, value in params.items():
        if top in EXECUTION_ONLY_SECTIONS:
            continue
        if top != "profiles":
            keys.append(top)
            continue
        for name, profile in value.items():
            for key in profile:
                if key != "execution":
                    keys.append(f"profiles.{name}.{key}")
                    continue
                keys += [f"profiles.{name}.execution.{k}" for k in profile["execution"] if k in RECORDED_EXECUTION_KEYS]
    return keys


def stage_params() -> list[str]:
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["pipeline"]
    (entry,) = stage["params"]
    return entry["params.yaml"]


def test_the_stage_tracks_every_output_key_of_params_yaml_and_no_execution_setting():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    expected = output_keys(params)
    assert stage_params() == expected, "dvc.yaml's params list, as params.yaml now needs it:\n" + "\n".join(
        f"          - {key}" for key in expected)
    assert "profiles.paper.execution.loader_workers" not in expected and "planning" not in expected
    assert "profiles.paper.execution.grad_probe_every" in expected and "profiles.paper.recipe" in expected


def test_changing_how_jobs_execute_leaves_the_stage_up_to_date(tmp_path, monkeypatch):
    """A DVC project whose stage has the pipeline's params list: once its lock is written, loader workers, the
    device, threads, checkpoint cadence and the partition limit change nothing; the learning rate does.
    DVC's own API, in this process: each `dvc` command would start an interpreter that imports DVC anew."""
    from dvc.repo import Repo
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    stage = {"cmd": "true", "params": [{"params.yaml": stage_params()}]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"pipeline": stage}}))
    Repo.init(str(tmp_path), no_scm=True).commit("pipeline", force=True)  # dvc.lock, as `dvc repro` leaves it
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())

    def status(change) -> dict:
        edited = json.loads(json.dumps(params))
        change(edited)
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
        return Repo(str(tmp_path)).status()

    def execution_only(p):
        p["profiles"]["paper"]["execution"].update(loader_workers=2, device="cuda:1", checkpoint_every_steps=7)
        p["profiles"]["tiny"]["execution"].update(threads=3, keep_resume_checkpoints=True)
        p["planning"]["partition_limit"] = "2-00:00:00"
    assert status(execution_only) == {}

    def learning_rate(p):
        p["profiles"]["tiny"]["recipe"]["lr"] = 3.0e-5
    changed = {"params.yaml": {"profiles.tiny.recipe": "modified"}}
    assert status(learning_rate) == {"pipeline": [{"changed deps": changed}]}
