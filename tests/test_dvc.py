"""DVC as its users expect, end to end on a reduced project (git + DVC in tmp_path, one `dvc repro`):
`dvc metrics show` prints the headline numbers, `dvc plots show` draws the convergence curves from
data, `dvc status` stays clean when Python writes caches under the code dependency, and
`dvc exp run --set-param` on one gamma reruns only that row's jobs and appears in `dvc exp show`."""
import hashlib
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

from hnclip.config.cells import AVG
from hnclip.report.metrics import table_mean_r1

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
GAMMAS, NEW_GAMMAS = [0.0, 0.5], [0.0, 0.25]
HEADLINE_ROWS = {"tok=1,hn=1": "hn_clip", "tok=0,hn=0": "longclip_ft"}  # Table 3b's rows of the two methods


def reduced_params() -> dict:
    """The embedded profile cut to a few seconds per job: Table 3a on DOCCI (two gammas) and Table
    3b's Long-CLIP FT and HN-CLIP rows on DOCCI (three training runs: HN-CLIP is 3a's gamma=0.5),
    the gamma-sweep figure and a convergence figure of those two rows."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    tiny = params["profiles"]["tiny"]
    tiny.update(seeds=[42], table_seeds={})
    for spec in tiny["datasets"].values():
        spec["sizes"] = {split: (48 if split == "train" else 32) for split in spec["sizes"]}
    tiny["recipe"].update(epochs=2, micro_batch=8, grad_accum=2)
    tiny["execution"].update(eval_batch_size=64, checkpoint_every_steps=2, keep_epoch_weights=False)
    params["backbones"]["tiny_pretrained"]["pretrain"].update(
        sizes={"train": 96, "test": 32}, epochs=1, batch_size=32, warmup_steps=0)
    tables = params["tables"]
    params["tables"] = {"table3a": {**tables["table3a"], "vary": {"gamma": GAMMAS}, "benchmarks": ["docci"]},
                        "table3b": {**tables["table3b"], "benchmarks": ["docci"],
                                    "rows": [r for r in tables["table3b"]["rows"] if r["key"] in HEADLINE_ROWS]}}
    figures = params["figures"]
    params["figures"] = {
        "table3a_gamma_sweep": figures["table3a_gamma_sweep"],
        "fig5_convergence": {**figures["fig5_convergence"], "series": [
            {"table": "table3b", "row": "tok=1,hn=1", "label": "HN-CLIP"},
            {"table": "table3b", "row": "tok=0,hn=0", "label": "Long-CLIP FT"}]}}
    return params


def run(cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, shell=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def job_stats(log_text: str) -> dict[str, int]:
    block = log_text.split("Job stats:")[1].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


def test_table_metric_averages_rows_then_their_cells():
    """Each reproduced row's mean R@1 over its cells, then the mean over rows: a row with fewer
    cells weighs as much as one with more; R@5, the Avg column and rows not implemented are left out."""
    def cell(row, bench, direction, metric, value, status="ok"):
        return {"row": row, "benchmark": bench, "direction": direction, "metric": metric, "ours_mean": value,
                "status": status}
    frame = pd.DataFrame([cell("a", "docci", "t2i", "R@1", 10.0), cell("a", "docci", "i2t", "R@1", 20.0),
                          cell("a", "docci", "t2i", "R@5", 90.0), cell("a", *AVG, 40.0),
                          cell("b", "dci", "t2i", "R@1", 40.0),
                          cell("c", "dci", "t2i", "R@1", float("nan"), status="not implemented yet")])
    assert table_mean_r1(frame) == pytest.approx((15.0 + 40.0) / 2)
    assert table_mean_r1(frame[frame["row"] == "c"]) is None


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A git repository with the project's DVC and Snakemake files and a copy of the code (so that
    caches written under it are this project's), after one `dvc repro`, results committed."""
    proj = tmp_path_factory.mktemp("dvcproj")
    for name in ("Snakefile", "dvc.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "workflow", proj / "workflow")
    shutil.copytree(ROOT / ".dvc", proj / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache", "config.local"))
    shutil.copytree(ROOT / "src" / "hnclip", proj / "src" / "hnclip", ignore=shutil.ignore_patterns("__pycache__"))
    (proj / ".venv").symlink_to(VENV_BIN.parent)
    (proj / "params.yaml").write_text(yaml.safe_dump(reduced_params(), sort_keys=False))
    run("git init -q && git config user.name test && git config user.email test@example.org"
        " && git add -A && git commit -qm init", proj)
    run(".venv/bin/dvc repro", proj)
    run("git add -A && git commit -qm 'dvc repro'", proj)
    return proj


@pytest.mark.slow
def test_metrics_show_prints_the_headline_numbers(project):
    shown = run(".venv/bin/dvc metrics show", project).stdout
    print(shown)
    assert "results/metrics.json" in shown and "table3a.mean_r1" in shown and "headline.docci.delta" in shown
    metrics = json.loads(run(".venv/bin/dvc metrics show --json", project).stdout)
    (workspace,) = metrics.values()  # one revision: the workspace
    values = workspace["data"]["results/metrics.json"]["data"]
    # Table 3a's metric is its Avg column (R@1 only) averaged over its rows.
    table3a = pd.read_csv(project / "results/tables/table3a.csv")
    assert values["table3a"]["mean_r1"] == pytest.approx(table3a[table3a["benchmark"] == "all"]["ours_mean"].mean(),
                                                         abs=1e-4)
    # Table 3b's is the mean of its rows' R@1 cells (its Avg column also averages R@5 and R@10).
    table3b = pd.read_csv(project / "results/tables/table3b.csv")
    r1 = table3b[(table3b["metric"] == "R@1") & (table3b["benchmark"] == "docci")]
    assert values["table3b"]["mean_r1"] == pytest.approx(r1["ours_mean"].mean(), abs=1e-4)
    # The headline cell: each method's mean of both directions' best-epoch R@1 from its evaluation record.
    cells = json.loads((project / "results/tables/table3b.provenance.json").read_text())["cells"]
    expected = {}
    for cell in cells:
        if cell["metric"] == "R@1":
            best = json.loads((project / cell["eval_file"]).read_text())["best"]["metrics"]
            expected[HEADLINE_ROWS[cell["row"]]] = (best["t2i"]["R@1"] + best["i2t"]["R@1"]) / 2
    docci = values["headline"]["docci"]
    assert docci["hn_clip"] == pytest.approx(expected["hn_clip"], abs=1e-4)
    assert docci["longclip_ft"] == pytest.approx(expected["longclip_ft"], abs=1e-4)
    assert docci["delta"] == pytest.approx(expected["hn_clip"] - expected["longclip_ft"], abs=2e-4)
    # The claims scorecard: how many claims got each verdict.
    verdicts = pd.read_csv(project / "results/claims.csv")["verdict"]
    assert sum(values["claims"].values()) == len(verdicts) > 0
    assert {v: n for v, n in values["claims"].items() if n} == verdicts.value_counts().to_dict()
    provenance = json.loads((project / "results/metrics.provenance.json").read_text())
    assert {"table:table3a", "table:table3b", "claims"} <= set(provenance["inputs"])


@pytest.mark.slow
def test_plots_show_draws_the_convergence_curves_from_data(project):
    shown = json.loads(run(".venv/bin/dvc plots show --json", project).stdout)
    (plot,) = shown["data"]["results/plots/convergence.csv"]
    content = plot["content"]
    assert content["facet"]["column"]["field"] == "benchmark"  # our template, not DVC's default
    points = pd.DataFrame(content["data"]["values"])
    assert set(points["series"]) == {"HN-CLIP", "Long-CLIP FT"} and set(points["benchmark"]) == {"docci"}
    assert sorted(points["epoch"].astype(int).unique()) == [0, 1, 2]  # initial backbone + 2 epochs
    cells = json.loads((project / "results/tables/table3b.provenance.json").read_text())["cells"]
    eval_file = next(c["eval_file"] for c in cells if c["row"] == "tok=1,hn=1")
    last = json.loads((project / eval_file).read_text())["per_epoch"][-1]
    hn_clip_last = points[(points["series"] == "HN-CLIP") & (points["epoch"].astype(int) == last["epoch"])]
    assert float(hn_clip_last["mean_r1"].iloc[0]) == pytest.approx(
        (last["metrics"]["t2i"]["R@1"] + last["metrics"]["i2t"]["R@1"]) / 2, abs=1e-4)
    run(".venv/bin/dvc plots show", project)
    assert (project / "dvc_plots" / "index.html").is_file()
    assert run("git status --porcelain", project).stdout == ""  # dvc_plots/ is ignored


@pytest.mark.slow
def test_status_stays_clean_when_python_writes_caches_under_the_code(project):
    # A module the pipeline never imported, imported from the project's code: new __pycache__ files.
    # (PYTHONDONTWRITEBYTECODE, set in some environments, would prevent them.)
    importing = "import sys; sys.path.insert(0, 'src'); import hnclip.provenance.lineage"
    run(f'env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "{importing}"', project)
    assert list((project / "src/hnclip/provenance/__pycache__").glob("lineage.*.pyc"))
    assert json.loads(run(".venv/bin/dvc status --json", project).stdout) == {}


@pytest.mark.slow
def test_missing_logs_and_benchmarks_rerun_nothing(project):
    # A fresh clone plus `dvc pull` has the outputs but no logs/ (where the benchmark files are).
    shutil.rmtree(project / "logs")
    assert "Nothing to be done" in run(".venv/bin/snakemake --workflow-profile workflow/profiles/default -n",
                                       project).stdout


@pytest.mark.slow
def test_exp_run_on_one_gamma_reruns_only_that_row(project):
    runs = {p.parent.name: md5(p) for p in (project / "results/runs").glob("*/train.json")}
    before = json.loads((project / "results/metrics.json").read_text())
    logs_before = set((project / ".snakemake/log").glob("*.log"))
    run(".venv/bin/dvc exp run --set-param 'tables.table3a.vary.gamma=[0.0,0.25]'", project)
    (log,) = set((project / ".snakemake/log").glob("*.log")) - logs_before
    # Table 3a on DOCCI with gamma 0.25: one training, its evaluation, the table, its figure and effects,
    # the claims scorecard that reads it, the metrics.
    assert job_stats(log.read_text()) == {"train": 1, "evaluate": 1, "table": 1, "figure": 1, "effects": 1,
                                          "claims": 1, "metrics": 1, "all": 1, "total": 8}
    after = {p.parent.name: md5(p) for p in (project / "results/runs").glob("*/train.json")}
    (new_run,) = set(after) - set(runs)
    assert {run_id: after[run_id] for run_id in runs} == runs  # persisted, not retrained
    record = json.loads((project / "results/runs" / new_run / "train.json").read_text())
    assert record["spec"]["objective"]["gamma"] == 0.25
    table3a = pd.read_csv(project / "results/tables/table3a.csv")
    assert set(table3a["row"]) == {"gamma=0", "gamma=0.25"}
    metrics = json.loads((project / "results/metrics.json").read_text())
    assert metrics["table3a"]["mean_r1"] == pytest.approx(table3a[table3a["benchmark"] == "all"]["ours_mean"].mean(),
                                                          abs=1e-4)
    assert metrics["headline"] == before["headline"]  # HN-CLIP (gamma 0.5) and Long-CLIP FT did not rerun
    diff = json.loads(run(".venv/bin/dvc metrics diff --all --json", project).stdout)["results/metrics.json"]
    assert (diff["table3a.mean_r1"]["old"], diff["table3a.mean_r1"]["new"]) == (
        before["table3a"]["mean_r1"], metrics["table3a"]["mean_r1"])
    # `dvc exp show` lists the experiment with its parameter and metrics.
    shown = json.loads(run(".venv/bin/dvc exp show --json", project).stdout)
    (baseline,) = [row for row in shown if row["rev"] != "workspace"]
    (experiment,) = baseline["experiments"]
    exp_data = experiment["revs"][0]["data"]
    assert exp_data["params"]["params.yaml"]["data"]["tables"]["table3a"]["vary"]["gamma"] == NEW_GAMMAS
    assert exp_data["metrics"]["results/metrics.json"]["data"] == metrics
    assert baseline["data"]["metrics"]["results/metrics.json"]["data"] == before


@pytest.mark.slow
def test_cache_holds_each_output_once_and_intact(project):
    """After the experiment's rerun (DVC copies persisted outputs out of the cache before the stage
    runs, jobs replace files inside the linked output folders), every output is a link to its cache
    object again, and every cache object still has the content its name says."""
    objects = [p for p in (project / ".dvc/cache/files/md5").glob("*/*") if not p.name.endswith(".dir")]
    assert objects and all(p.parent.name + p.name == md5(p) for p in objects)
    models = list((project / "results/runs").glob("*/model.pt"))
    assert len(models) == 4
    for model in models:
        digest = md5(model)
        assert model.is_symlink() and model.samefile(project / ".dvc/cache/files/md5" / digest[:2] / digest[2:])
