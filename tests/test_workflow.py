"""End to end on a micro version of the embedded profile, through `dvc repro` on a fresh git repo:
outputs and provenance exist, a second run is a no-op, changing one gamma reruns only that cell,
and a malformed params.yaml fails before any job starts."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def micro_params() -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    tiny = params["profiles"]["tiny"]
    tiny["seeds"] = [42]
    tiny["table_seeds"] = {}
    for spec in tiny["datasets"].values():
        spec["sizes"] = {split: (48 if split == "train" else 32) for split in spec["sizes"]}
    tiny["recipe"].update(epochs=2, micro_batch=8, grad_accum=2)
    tiny["execution"].update(eval_batch_size=64, checkpoint_every_steps=2, keep_epoch_weights=False)
    params["backbones"]["tiny_pretrained"]["pretrain"].update(
        sizes={"train": 96, "test": 32}, epochs=1, batch_size=32, warmup_steps=0)
    params["tables"] = {name: params["tables"][name] for name in ("table1", "table3a")}
    params["figures"] = {name: spec for name, spec in params["figures"].items()
                         if {spec.get("table"), *(s["table"] for s in spec.get("series", []))} <= {None, "table1", "table3a"}}
    params["tables"]["table3a"]["vary"]["gamma"] = [0.0, 0.5]
    return params


def run(cmd, cwd, check=True):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, shell=isinstance(cmd, str))
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def job_counts(dry_run_output: str) -> dict:
    block = dry_run_output.split("Job stats:")[1].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A fresh git + DVC project with the micro params, after one `dvc repro`."""
    proj = tmp_path_factory.mktemp("proj")
    for name in ("Snakefile", "dvc.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "workflow", proj / "workflow")
    shutil.copytree(ROOT / ".dvc", proj / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    (proj / "src").mkdir()
    (proj / "src" / "hnclip").symlink_to(ROOT / "src" / "hnclip")  # dvc.yaml's code dependency
    (proj / ".venv").symlink_to(VENV_BIN.parent)
    (proj / "params.yaml").write_text(yaml.safe_dump(micro_params(), sort_keys=False))
    run("git init -q && git add -A && git commit -qm init", proj)
    first = run(".venv/bin/dvc repro", proj)
    return proj, first


def test_dvc_repro_builds_table_figure_and_stats(project):
    proj, _ = project
    for rel in ("results/tables/table3a.md", "results/tables/table3a.tex", "figures/table3a_gamma_sweep.png",
                "figures/table3a_gamma_sweep.pdf", "results/stats/docci.json", "results/stats/long_dci.json"):
        assert (proj / rel).stat().st_size > 0, rel
    csv = pd.read_csv(proj / "results/tables/table3a.csv")
    assert set(csv["row"]) == {"gamma=0", "gamma=0.5"}
    assert len(csv) == 2 * (4 * 2 + 1)  # 4 benchmarks x 2 directions + the average column
    assert csv["ours_mean"].between(0, 100).all() and (csv["selection"] == "best").all()
    md = (proj / "results/tables/table3a.md").read_text()
    assert "different scale" in md and "| gamma=0.5 |" in md
    table1 = pd.read_csv(proj / "results/tables/table1.csv")
    goal = table1[table1["row"] == "goal"]
    assert (goal["status"] == "not implemented yet").all() and goal["ours_mean"].isna().all()
    assert goal["paper"].notna().all()
    zeroshot = table1[table1["row"] == "longclip_zeroshot"]
    assert (zeroshot["status"] == "ok").all() and zeroshot["ours_mean"].notna().all()
    assert "n/i" in (proj / "results/tables/table1.md").read_text()
    lock = yaml.safe_load((proj / "dvc.lock").read_text())
    outs = {o["path"]: o for o in lock["stages"]["paper"]["outs"]}
    assert {"results/runs", "results/tables", "figures"} <= set(outs) and outs["results/runs"]["md5"]


def test_provenance_chain_from_table_to_weights(project):
    proj, _ = project
    record = json.loads((proj / "results/tables/table3a.provenance.json").read_text())
    assert record["git"]["commit"] and record["libraries"]["torch"].startswith("2.14.1")
    cell = next(c for c in record["cells"] if c["row"] == "gamma=0.5" and c["benchmark"] == "long_dci")
    evaluation = json.loads((proj / cell["eval_file"]).read_text())
    assert evaluation["best"]["epoch"] == cell["epoch"]
    assert evaluation["consistent_with_training"] is True
    train = json.loads((proj / "results/runs" / cell["run_id"] / "train.json").read_text())
    from hnclip.provenance.hashing import sha256_file
    model_sha = sha256_file(proj / "results/runs" / cell["run_id"] / "model.pt")
    assert evaluation["provenance"]["inputs"]["model"]["sha256"] == model_sha == train["outputs"]["model"]["sha256"]
    assert train["spec"]["objective"]["gamma"] == 0.5 and train["spec"]["train_set"] == "dci"
    assert train["inputs"]["init_weights"]["sha256"] == sha256_file(proj / "results/backbones/tiny_pretrained/model.pt")
    assert {"docci", "long_dci"} & set(train["history"][0]["eval"]) == {"long_dci"}


def test_only_the_gradient_figure_runs_are_probed(project):
    proj, _ = project
    records = {p.parent.name: json.loads(p.read_text()) for p in (proj / "results/runs").glob("*/train.json")}
    probed = {run for run, r in records.items() if r["params"]["grad_probe_every"]}
    assert probed and all((proj / "results/runs" / run / "grad_probe.jsonl").stat().st_size for run in probed)
    assert {records[run]["spec"]["train_set"] for run in probed} == {"docci"}  # Fig. 4: HN-CLIP on DOCCI
    for run, record in records.items():
        assert (run in probed) == (proj / "results/runs" / run / "grad_probe.jsonl").exists()
        assert record["saved_weights_match_last_epoch"] is True


def test_report_groups_tables_and_figures_by_paper_section(project):
    proj, _ = project
    run(".venv/bin/snakemake --workflow-profile workflow/profiles/default --report report.html", proj)
    html = (proj / "report.html").read_text()
    for section in ("3.2 Main results", "3.5 Ablations", "2.4 Gradient-dynamics analysis",
                    "A.4 Statistics of the caption geometry"):
        assert section in html, section


def test_second_run_is_a_noop(project):
    proj, _ = project
    again = run(".venv/bin/dvc repro", proj)
    assert "didn't change" in again.stdout
    assert "Nothing to be done" in run(".venv/bin/snakemake -n", proj).stdout


def test_changing_one_gamma_reruns_only_that_cell(project):
    proj, _ = project
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["tables"]["table3a"]["vary"]["gamma"] = [0.0, 0.75]
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        counts = job_counts(run(".venv/bin/snakemake -n", proj).stdout)
    finally:
        run("git checkout -- params.yaml", proj)
    assert counts == {"train": 3, "evaluate": 4, "table": 1, "figure": 1, "all": 1, "total": 10}  # table3a only


def test_malformed_params_fail_before_any_job(project):
    proj, _ = project
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["tables"]["table3a"]["vary"]["gamma"] = [0.0, -0.5]
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        proc = run(".venv/bin/snakemake --cores 1", proj, check=False)
    finally:
        run("git checkout -- params.yaml", proj)
    assert proc.returncode != 0
    assert "tables.table3a.vary.gamma.1: -0.5 is less than the minimum of 0" in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout
