"""The workflow. Dry runs of the embedded and paper profiles: every job is benchmarked, takes the
threads, memory and GPU slots it needs. End to end on a micro version of the embedded profile,
through `dvc repro` on a fresh git repo: outputs and provenance exist, a second run is a no-op,
changing one gamma reruns only that cell, and a malformed params.yaml fails before any job starts."""
import json
import re
import shutil

import pandas as pd
import pytest
import yaml
from helpers.micro_project import ROOT, VENV_BIN, micro_params, run

SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
DRY_RUN_CORES = 64  # more than any rule's threads
# Snakemake as the DVC stage runs it: with the workflow profile's rerun triggers (params and inputs,
# not the mtimes that DVC's links to its cache change).
SNAKEMAKE = ".venv/bin/snakemake --workflow-profile workflow/profiles/default"


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
    assert set(table1["row"]) == {"longclip_zeroshot", "finelip", "goal", "structxlip", "hn_clip"}
    assert (table1["status"] == "ok").all() and table1["ours_mean"].notna().all()  # every framework trains here
    assert table1[table1["row"] == "goal"]["paper"].notna().all()
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
def test_report_groups_tables_and_figures_by_paper_section(project):
    proj, _ = project
    run(f"{SNAKEMAKE} --report report.html", proj)
    html = (proj / "report.html").read_text()
    for section in ("3.2 Main results", "3.5 Ablations", "2.4 Gradient-dynamics analysis",
                    "A.4 Statistics of the caption geometry"):
        assert section in html, section


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


# ---- dry runs: what each job declares ---------------------------------------------------------------
def dry_run_jobs(text: str) -> list[dict]:
    """The jobs of `snakemake -n` output: {"rule", and each `key: value` line of its block}."""
    jobs = []
    for line in text.splitlines():
        header = re.match(r"^(?:local)?rule (\w+):$", line)
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
              for m in re.finditer(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", smk.read_text(), re.M | re.S)}
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
    assert "set-threads" not in yaml.safe_load(SLURM_PROFILE.read_text())  # nothing to correct any more


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
