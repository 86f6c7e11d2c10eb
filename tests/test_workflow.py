"""The workflow. End to end on a micro version of the embedded profile, through `dvc repro` on a fresh
git repo with a copy of the code: outputs and provenance exist, DVC shows the headline metrics and draws
the convergence plot from data, a second run is a no-op (also after Python wrote caches under the code,
and without the logs a fresh clone lacks), changing one gamma reruns only that cell (planned with
Snakemake, then run with `dvc exp run`), and a malformed params.yaml fails before any job starts.
Dry runs of the embedded and paper profiles: every job is benchmarked, takes the threads, memory and
GPU slots it needs."""
import hashlib
import json
import re
import shutil

import pandas as pd
import pytest
import yaml
from helpers.micro_project import MICRO_TABLE1_ROWS, ROOT, VENV_BIN, micro_params, run

from hnclip.commands.metrics import table_mean_r1
from hnclip.config.cells import AVG

SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
DRY_RUN_CORES = 64  # more than any rule's threads
# Snakemake as the DVC stage runs it: with the workflow profile's rerun triggers (params and inputs,
# not the mtimes that DVC's links to its cache change).
SNAKEMAKE = ".venv/bin/snakemake --workflow-profile workflow/profiles/default"
NEW_GAMMAS = [0.0, 0.25]  # what `dvc exp run` sets Table 3a's gammas to
HEADLINE_ROWS = {"tok=1,hn=1": "hn_clip", "tok=0,hn=0": "longclip_ft"}  # Table 3b's rows of the two methods


def job_counts(snakemake_output: str) -> dict:
    """The "Job stats" block of a Snakemake dry run or log: {rule: jobs, "total": all}."""
    block = snakemake_output.split("Job stats:")[1].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", block, re.M)}


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def workflow_params() -> dict:
    """The micro params, plus Table 3b's two headline rows on DOCCI (Long-CLIP FT and HN-CLIP, which is
    Table 3a's gamma=0.5 run) and their convergence figure: what DVC's metrics and plots show."""
    params = micro_params()
    full = yaml.safe_load((ROOT / "params.yaml").read_text())
    table3b = full["tables"]["table3b"]
    params["tables"]["table3b"] = {**table3b, "benchmarks": ["docci"],
                                   "rows": [r for r in table3b["rows"] if r["key"] in HEADLINE_ROWS]}
    params["figures"]["fig5_convergence"] = {**full["figures"]["fig5_convergence"], "series": [
        {"table": "table3b", "row": "tok=1,hn=1", "label": "HN-CLIP"},
        {"table": "table3b", "row": "tok=0,hn=0", "label": "Long-CLIP FT"}]}
    return params


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
    """A fresh git + DVC project with the workflow params and a copy of the code (so that caches
    written under it are this project's, and edits to the live tree while the tests run are not code
    changes), after one `dvc repro`, results committed. The tests below run in file order: the last
    one changes the workspace (`dvc exp run`)."""
    proj = tmp_path_factory.mktemp("proj")
    for name in ("Snakefile", "dvc.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "workflow", proj / "workflow")
    shutil.copytree(ROOT / ".dvc", proj / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache", "config.local"))
    shutil.copytree(ROOT / "src" / "hnclip", proj / "src" / "hnclip", ignore=shutil.ignore_patterns("__pycache__"))
    (proj / ".venv").symlink_to(VENV_BIN.parent)
    (proj / "params.yaml").write_text(yaml.safe_dump(workflow_params(), sort_keys=False))
    run("git init -q && git add -A && git commit -qm init", proj)
    first = run(".venv/bin/dvc repro", proj)
    run("git add -A && git commit -qm 'dvc repro'", proj)
    return proj, first


@pytest.mark.slow
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
    assert "different scale" in md and "| γ = 0.5 |" in md
    table1 = pd.read_csv(proj / "results/tables/table1.csv")
    assert set(table1["row"]) == set(MICRO_TABLE1_ROWS)
    assert (table1["status"] == "ok").all() and table1["ours_mean"].notna().all()
    assert table1[table1["row"] == "hn_clip"]["paper"].notna().all()
    lock = yaml.safe_load((proj / "dvc.lock").read_text())
    outs = {o["path"]: o for o in lock["stages"]["pipeline"]["outs"]}
    assert {"results/runs", "results/tables", "figures", "results/metrics.json"} <= set(outs)
    assert outs["results/runs"]["md5"]


@pytest.mark.slow
def test_provenance_chain_from_table_to_weights(project):
    proj, _ = project
    record = json.loads((proj / "results/tables/table3a.provenance.json").read_text())
    assert record["git"]["commit"] and record["libraries"]["torch"].startswith("2.14.1")
    cell = next(c for c in record["cells"] if c["row"] == "gamma=0.5" and c["benchmark"] == "long_dci")
    evaluation = json.loads((proj / cell["eval_file"]).read_text())
    assert evaluation["best"]["epoch"] == cell["epoch"]
    assert evaluation["consistent_with_training"] is True
    train = json.loads((proj / "results/runs" / cell["run_id"] / "train.json").read_text())
    from hnclip.hashing import sha256_file
    model_sha = sha256_file(proj / "results/runs" / cell["run_id"] / "model.pt")
    assert evaluation["provenance"]["inputs"]["model"]["sha256"] == model_sha == train["outputs"]["model"]["sha256"]
    assert train["spec"]["objective"]["gamma"] == 0.5 and train["spec"]["train_set"] == "dci"
    assert train["inputs"]["init_weights"]["sha256"] == sha256_file(proj / "results/backbones/tiny_pretrained/model.pt")
    assert {"docci", "long_dci"} & set(train["history"][0]["eval"]) == {"long_dci"}


@pytest.mark.slow
def test_only_the_gradient_figure_runs_are_probed(project):
    proj, _ = project
    records = {p.parent.name: json.loads(p.read_text()) for p in (proj / "results/runs").glob("*/train.json")}
    probed = {run_id for run_id, r in records.items() if r["params"]["grad_probe_every"]}
    assert probed and all((proj / "results/runs" / run_id / "grad_probe.jsonl").stat().st_size for run_id in probed)
    assert {records[run_id]["spec"]["train_set"] for run_id in probed} == {"docci"}  # Fig. 4: HN-CLIP on DOCCI
    for run_id, record in records.items():
        assert (run_id in probed) == (proj / "results/runs" / run_id / "grad_probe.jsonl").exists()
        assert record["saved_weights_match_last_epoch"] is True


@pytest.mark.slow
def test_metrics_show_prints_the_headline_numbers(project):
    proj, _ = project
    shown = run(".venv/bin/dvc metrics show", proj).stdout
    print(shown)
    assert "results/metrics.json" in shown and "table3a.mean_r1" in shown and "headline.docci.delta" in shown
    metrics = json.loads(run(".venv/bin/dvc metrics show --json", proj).stdout)
    (workspace,) = metrics.values()  # one revision: the workspace
    values = workspace["data"]["results/metrics.json"]["data"]
    # Table 3a's metric is its Avg column (R@1 only) averaged over its rows.
    table3a = pd.read_csv(proj / "results/tables/table3a.csv")
    assert values["table3a"]["mean_r1"] == pytest.approx(table3a[table3a["benchmark"] == "all"]["ours_mean"].mean(),
                                                         abs=1e-4)
    # Table 3b's is the mean of its rows' R@1 cells (its Avg column also averages R@5 and R@10).
    table3b = pd.read_csv(proj / "results/tables/table3b.csv")
    r1 = table3b[(table3b["metric"] == "R@1") & (table3b["benchmark"] == "docci")]
    assert values["table3b"]["mean_r1"] == pytest.approx(r1["ours_mean"].mean(), abs=1e-4)
    # The headline cell: each method's mean of both directions' best-epoch R@1 from its evaluation record.
    cells = json.loads((proj / "results/tables/table3b.provenance.json").read_text())["cells"]
    expected = {}
    for cell in cells:
        if cell["metric"] == "R@1":
            best = json.loads((proj / cell["eval_file"]).read_text())["best"]["metrics"]
            expected[HEADLINE_ROWS[cell["row"]]] = (best["t2i"]["R@1"] + best["i2t"]["R@1"]) / 2
    docci = values["headline"]["docci"]
    assert docci["hn_clip"] == pytest.approx(expected["hn_clip"], abs=1e-4)
    assert docci["longclip_ft"] == pytest.approx(expected["longclip_ft"], abs=1e-4)
    assert docci["delta"] == pytest.approx(expected["hn_clip"] - expected["longclip_ft"], abs=2e-4)
    # The claims scorecard: how many claims got each verdict.
    verdicts = pd.read_csv(proj / "results/claims.csv")["verdict"]
    assert sum(values["claims"].values()) == len(verdicts) > 0
    assert {v: n for v, n in values["claims"].items() if n} == verdicts.value_counts().to_dict()
    provenance = json.loads((proj / "results/metrics.provenance.json").read_text())
    assert {"table:table3a", "table:table3b", "claims"} <= set(provenance["inputs"])


@pytest.mark.slow
def test_plots_show_draws_the_convergence_curves_from_data(project):
    proj, _ = project
    shown = json.loads(run(".venv/bin/dvc plots show --json", proj).stdout)
    (plot,) = shown["data"]["results/plots/convergence.csv"]
    content = plot["content"]
    assert content["facet"]["column"]["field"] == "benchmark"  # our template, not DVC's default
    points = pd.DataFrame(content["data"]["values"])
    assert set(points["series"]) == {"HN-CLIP", "Long-CLIP FT"} and set(points["benchmark"]) == {"docci"}
    assert sorted(points["epoch"].astype(int).unique()) == [0, 1, 2]  # initial backbone + 2 epochs
    cells = json.loads((proj / "results/tables/table3b.provenance.json").read_text())["cells"]
    eval_file = next(c["eval_file"] for c in cells if c["row"] == "tok=1,hn=1")
    last = json.loads((proj / eval_file).read_text())["per_epoch"][-1]
    hn_clip_last = points[(points["series"] == "HN-CLIP") & (points["epoch"].astype(int) == last["epoch"])]
    assert float(hn_clip_last["mean_r1"].iloc[0]) == pytest.approx(
        (last["metrics"]["t2i"]["R@1"] + last["metrics"]["i2t"]["R@1"]) / 2, abs=1e-4)
    run(".venv/bin/dvc plots show", proj)
    assert (proj / "dvc_plots" / "index.html").is_file()
    assert run("git status --porcelain", proj).stdout == ""  # dvc_plots/ is ignored


@pytest.mark.slow
def test_report_groups_tables_and_figures_by_paper_section(project):
    proj, _ = project
    run(f"{SNAKEMAKE} --report report.html", proj)
    html = (proj / "report.html").read_text()
    for section in ("3.2 Main results", "3.5 Ablations", "2.4 Gradient-dynamics analysis",
                    "A.4 Statistics of the caption geometry"):
        assert section in html, section


@pytest.mark.slow
def test_status_stays_clean_when_python_writes_caches_under_the_code(project):
    proj, _ = project
    # A module the pipeline never imported, imported from the project's code: new __pycache__ files.
    # (PYTHONDONTWRITEBYTECODE, set in some environments, would prevent them.)
    importing = "import sys; sys.path.insert(0, 'src'); import hnclip.provenance.lineage"
    run(f'env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "{importing}"', proj)
    assert list((proj / "src/hnclip/provenance/__pycache__").glob("lineage.*.pyc"))
    assert json.loads(run(".venv/bin/dvc status --json", proj).stdout) == {}


@pytest.mark.slow
def test_second_run_is_a_noop(project):
    proj, _ = project
    again = run(".venv/bin/dvc repro", proj)
    assert "didn't change" in again.stdout
    assert "Nothing to be done" in run(f"{SNAKEMAKE} -n", proj).stdout


@pytest.mark.slow
def test_changing_one_gamma_reruns_only_that_cell(project):
    proj, _ = project
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["tables"]["table3a"]["vary"]["gamma"] = [0.0, 0.75]
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        counts = job_counts(run(f"{SNAKEMAKE} -n", proj).stdout)
    finally:
        run("git checkout -- params.yaml", proj)
    # table3a only, and Table A3: its HN-CLIP row (DCI, gamma 0.5) was a run of table3a alone here
    assert counts == {"train": 3, "evaluate": 4, "table": 1, "figure": 1, "effects": 1, "claims": 1, "metrics": 1,
                      "timing_table": 1, "all": 1, "total": 14}


@pytest.mark.slow
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


@pytest.mark.slow
def test_missing_logs_and_benchmarks_rerun_nothing(project):
    proj, _ = project
    # A fresh clone plus `dvc pull` has the outputs but no logs/ (where the benchmark files are).
    shutil.rmtree(proj / "logs")
    assert "Nothing to be done" in run(".venv/bin/snakemake --workflow-profile workflow/profiles/default -n",
                                       proj).stdout


@pytest.mark.slow
def test_exp_run_on_one_gamma_reruns_only_that_row(project):
    proj, _ = project
    runs = {p.parent.name: md5(p) for p in (proj / "results/runs").glob("*/train.json")}
    before = json.loads((proj / "results/metrics.json").read_text())
    logs_before = set((proj / ".snakemake/log").glob("*.log"))
    run(f".venv/bin/dvc exp run --set-param 'tables.table3a.vary.gamma={json.dumps(NEW_GAMMAS)}'", proj)
    (log,) = set((proj / ".snakemake/log").glob("*.log")) - logs_before
    # Table 3a's gamma 0.25 row: one training per training set (DOCCI, DCI, VG) and their evaluations
    # on its four benchmarks, the table, its figure and effects, the claims scorecard and Table A3 that
    # read it, the metrics: what the dry run above planned, nothing more.
    assert job_counts(log.read_text()) == {"train": 3, "evaluate": 4, "table": 1, "figure": 1, "effects": 1,
                                           "claims": 1, "metrics": 1, "timing_table": 1, "all": 1, "total": 14}
    after = {p.parent.name: md5(p) for p in (proj / "results/runs").glob("*/train.json")}
    assert {run_id: after[run_id] for run_id in runs} == runs  # persisted, not retrained
    records = [json.loads((proj / "results/runs" / run_id / "train.json").read_text())
               for run_id in set(after) - set(runs)]
    assert sorted(r["spec"]["train_set"] for r in records) == ["dci", "docci", "vg"]
    assert {r["spec"]["objective"]["gamma"] for r in records} == {0.25}
    table3a = pd.read_csv(proj / "results/tables/table3a.csv")
    assert set(table3a["row"]) == {"gamma=0", "gamma=0.25"}
    metrics = json.loads((proj / "results/metrics.json").read_text())
    assert metrics["table3a"]["mean_r1"] == pytest.approx(table3a[table3a["benchmark"] == "all"]["ours_mean"].mean(),
                                                          abs=1e-4)
    # The headline compares the recipes of HN-CLIP (gamma 0.5) and Long-CLIP FT wherever a table plans both:
    # DOCCI keeps them (Table 3b, not rerun); DCI, Long-DCI and Urban-1K had them only as Table 3a's rows.
    assert before["headline"].keys() == {"docci", "dci", "long_dci", "urban1k"}
    assert metrics["headline"] == {"docci": before["headline"]["docci"]}
    diff = json.loads(run(".venv/bin/dvc metrics diff --all --json", proj).stdout)["results/metrics.json"]
    assert (diff["table3a.mean_r1"]["old"], diff["table3a.mean_r1"]["new"]) == (
        before["table3a"]["mean_r1"], metrics["table3a"]["mean_r1"])
    # `dvc exp show` lists the experiment with its parameter and metrics.
    shown = json.loads(run(".venv/bin/dvc exp show --json", proj).stdout)
    (baseline,) = [row for row in shown if row["rev"] != "workspace"]
    (experiment,) = baseline["experiments"]
    exp_data = experiment["revs"][0]["data"]
    assert exp_data["params"]["params.yaml"]["data"]["tables"]["table3a"]["vary"]["gamma"] == NEW_GAMMAS
    assert exp_data["metrics"]["results/metrics.json"]["data"] == metrics
    assert baseline["data"]["metrics"]["results/metrics.json"]["data"] == before


# ---- dry runs: what each job declares ---------------------------------------------------------------
def dry_run_jobs(text: str) -> list[dict]:
    """The jobs of `snakemake -n` output: {"rule", and each `key: value` line of its block}."""
    jobs = []
    for line in text.splitlines():
        header = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line)
        if header:
            jobs.append({"rule": header.group(1)})
        elif jobs and (field := re.match(r"^    (\w+): (.*)$", line)):
            jobs[-1][field.group(1)] = field.group(2)
    return jobs


def resources(job: dict) -> dict[str, str]:
    return dict(item.split("=", 1) for item in job.get("resources", "").split(", ") if "=" in item)


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """Every job of the embedded and the paper profile from scratch (no data, no results)."""
    proj = tmp_path_factory.mktemp("dry")
    shutil.copy(ROOT / "Snakefile", proj / "Snakefile")
    shutil.copy(ROOT / "params.yaml", proj / "params.yaml")
    shutil.copytree(ROOT / "workflow", proj / "workflow")
    return {profile: dry_run_jobs(run(f"{VENV_BIN}/snakemake -n --cores {DRY_RUN_CORES} --config profile={profile}",
                                      proj).stdout)
            for profile in ("tiny", "paper")}


def slurm_resources() -> dict[str, dict]:
    return yaml.safe_load(SLURM_PROFILE.read_text())["set-resources"]


def test_every_rule_writes_a_benchmark_file_that_git_ignores(dry_runs):
    blocks = {m.group(1): m.group(2) for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk"))
              for m in re.finditer(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", smk.read_text(), re.M | re.S)}
    missing = sorted(rule for rule, body in blocks.items() if not re.search(r"^    benchmark:", body, re.M))
    assert blocks and not missing, f"rules without a benchmark: directive: {missing}"
    jobs = [job for profile_jobs in dry_runs.values() for job in profile_jobs if job["rule"] != "all"]
    assert all("benchmark" in job for job in jobs)
    paths = sorted({job["benchmark"] for job in jobs})
    ignored = run(["git", "check-ignore", "--no-index", *paths], ROOT, check=False).stdout.split()
    assert ignored == paths


def test_pretraining_threads_do_not_follow_the_cores(dry_runs):
    (pretrain,) = [job for job in dry_runs["tiny"] if job["rule"] == "pretrain_backbone"]
    assert int(pretrain["threads"]) == slurm_resources()["pretrain_backbone"]["cpus_per_task"] < DRY_RUN_CORES
    # the one rule whose threads follow the cores on one machine (step_timing: nothing may share what it times)
    assert yaml.safe_load(SLURM_PROFILE.read_text())["set-threads"] == {"step_timing": 8}


def test_evaluation_takes_a_gpu_slot_and_model_memory_only_when_it_encodes(dry_runs):
    benchmarks = yaml.safe_load((ROOT / "params.yaml").read_text())["benchmarks"]
    kinds = set()
    for job in (job for job in dry_runs["paper"] if job["rule"] == "evaluate"):
        wildcards = dict(item.split("=", 1) for item in job["wildcards"].split(", "))
        train_set = wildcards["run"].split("-", 1)[0]  # run ids start with their training set
        encodes = train_set == "zeroshot" or benchmarks[wildcards["benchmark"]]["train"] != train_set
        got = resources(job)
        assert (got["gpu"], int(got["mem_mb"]) > 1000) == (str(int(encodes)), encodes), job
        kinds.add(encodes)
    assert kinds == {True, False}
    assert all(resources(job)["gpu"] == "0" for job in dry_runs["tiny"] if job["rule"] == "evaluate")  # CPU profile


def test_paper_jobs_declare_the_memory_the_slurm_profile_books(dry_runs):
    booked = slurm_resources()
    checked = set()
    for job in dry_runs["paper"]:
        got = resources(job)
        if job["rule"] in ("train", "caption_stats", "dataset") or (job["rule"] == "evaluate" and got["gpu"] == "1"):
            assert int(got["mem_mb"]) == booked[job["rule"]]["mem_mb"], job
            checked.add(job["rule"])
    assert checked == {"train", "caption_stats", "dataset", "evaluate"}
    tiny_train = next(job for job in dry_runs["tiny"] if job["rule"] == "train")
    assert int(resources(tiny_train)["mem_mb"]) < booked["train"]["mem_mb"]  # the miniature books less
