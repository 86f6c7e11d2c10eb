"""The workflow through a real SLURM cluster (scripts/local_slurm.py) and the SLURM profile.

One module fixture starts a single-node cluster shaped like a GPU node (32 CPUs, 256 GB and two
A100s declared; the GPUs are /dev/null and every job still computes on the CPU), generates the
datasets of one Table 3a cell of the micro profile once, and runs three Snakemake invocations at once:

* `slurm`: `--profile workflow/profiles/slurm` as shipped, plus the flags this accounting-less test
  cluster needs: pretrain_backbone, train, evaluate and table each run as an sbatch job with the
  profile's GPU, memory and CPU requests and its runtime (train and evaluate: the time limit their
  rules book from `hnclip plan`'s estimate);
* `local`: `--cores 2` on the same params and data, the reference;
* `failing`: the SLURM run of a project whose pretraining manifest is broken (a row without fields),
  with the CPU-only overrides a cluster without GPUs would use: pretraining raises inside its job;
* `limited`: the SLURM run of the training run under a partition limit half its booked time limit
  (`planning.partition_limit`): it trains in two allocations of one epoch each (`train_part`, then
  `train`), and its last allocation is cancelled with `scancel` while it runs; the retry resumes from
  the checkpoint, and no allocation is booked over the limit.

Running them side by side keeps the file's cost near that of the SLURM run alone, which is bound by
the executor's status polling (first check after 5 s, then every 10 s longer until a job ends).
If the SLURM packages cannot be installed, the tests fail with the reason; they are never skipped.
"""
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers.micro_project import micro_params

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "scripts"))
import local_slurm  # noqa: E402

from hnclip.config import paths  # noqa: E402  (no torch import: keeps the fixture's own start fast)
from hnclip.config.registry import Registry  # noqa: E402
from hnclip.plan.cost_plan import PLANNED_RULES, build_plan  # noqa: E402

pytestmark = pytest.mark.slow

PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
TABLE = "table3a"
TABLE_CSV = f"results/tables/{TABLE}.csv"
BACKBONE = "tiny_pretrained"
DATASETS = ("docci", "pretrain")  # what Table 3a's DOCCI cell is trained and pretrained on
GPU_RULES = ("train", "train_part", "pretrain_backbone", "evaluate", "caption_stats", "step_timing",
             "auxiliary_segments_shard")  # a shard of segments: SAM + CLIP
RUN_TIMEOUT_S = 900
# What the test cluster lacks compared with a production one: no slurmdbd, so no sacct.
TEST_CLUSTER_FLAGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "5",
                      "--default-resources", "slurm_partition=debug"]
# Float reductions depend on the thread count: pin pretraining to the local run's 2 threads.
SAME_THREADS_AS_LOCAL = ["--set-threads", "pretrain_backbone=2"]
LIMIT_MIN = 10  # the `limited` project's partition limit: one epoch's booked time fits, the run's does not
# A cluster without GPUs: `--set-resources` replaces the profile's whole set-resources key.
CPU_ONLY_RESOURCES = ["pretrain_backbone:gpu=0", "pretrain_backbone:gpu_model=''", "pretrain_backbone:mem_mb=1000",
                      "pretrain_backbone:runtime=10", "pretrain_backbone:cpus_per_task=1"]


# ---- projects -----------------------------------------------------------------------------------
def tables_named(node) -> set:
    """Every value under a `table` key, at any depth (figure entries name the tables they draw)."""
    if isinstance(node, dict):
        return {v for k, v in node.items() if k == "table"} | set().union(*map(tables_named, node.values()))
    if isinstance(node, list):
        return set().union(*map(tables_named, node))
    return set()


def one_table_params() -> dict:
    """The micro params cut to one cell of Table 3a (gamma 0.5, DOCCI only: one training run) and to
    two optimizer steps per training, so that each job ends before the executor's second poll."""
    params = micro_params()
    tiny = params["profiles"]["tiny"]
    tiny["datasets"]["docci"]["sizes"] = {"train": 32, "test": 16}
    tiny["recipe"].update(epochs=2)  # two: a run the partition limit can split into allocations of an epoch
    params["backbones"][BACKBONE]["pretrain"].update(sizes={"train": 64, "test": 16})
    params["tables"] = {TABLE: params["tables"][TABLE]}
    params["tables"][TABLE]["vary"]["gamma"] = [0.5]
    params["tables"][TABLE]["benchmarks"] = ["docci"]
    if "figures" in params:
        params["figures"] = {k: f for k, f in params["figures"].items() if tables_named(f) <= {TABLE}}
    return params


def limited_params(params: dict) -> dict:
    """`params` under a partition limit that one epoch of the training run fits and the whole run does not:
    no start-up allowance, and a safety factor that books one epoch at 0.8 x LIMIT_MIN (the run: twice that)."""
    limited = copy.deepcopy(params)
    planning = limited["planning"] = {**limited.get("planning", {}), "startup_min": 0, "safety_factor": 1,
                                      "partition_limit": None}
    (train,) = [job for job in build_plan(Registry(limited)).jobs.values() if job.rule == "train"]
    planning["safety_factor"] = 0.8 * LIMIT_MIN * train.epochs / (train.hours * 60)
    planning["partition_limit"] = LIMIT_MIN
    return limited


def make_project(path: Path, params: dict) -> Path:
    path.mkdir(parents=True)
    shutil.copy(ROOT / "Snakefile", path / "Snakefile")
    shutil.copytree(ROOT / "workflow", path / "workflow")
    (path / "src").mkdir()
    (path / "src" / "hnclip").symlink_to(ROOT / "src" / "hnclip")
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def generate_datasets(project: Path, env: dict) -> None:
    """The table's datasets, generated once and shared by the three projects: they are CPU work
    with no GPU request, and one SLURM poll level less keeps the file near its time budget."""
    procs = [subprocess.Popen([sys.executable, "-m", "hnclip", "data", role], cwd=project, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for role in DATASETS]
    for role, proc in zip(DATASETS, procs):
        assert proc.wait() == 0, f"hnclip data {role} failed:\n{proc.stderr.read()}"


def break_pretraining_manifest(project: Path) -> Path:
    """The pretraining corpus's training manifest with a row that lacks its fields: the DAG is fine (the
    rule's input is the dataset's marker), and the job raises as it reads the manifest, before any training
    step. (A broken resume checkpoint would not do: a run whose checkpoint does not load trains afresh.)"""
    broken = project / paths.manifest(one_table_params()["profiles"]["tiny"]["data_root"], "pretrain", "train")
    broken.write_text('{"id": "broken"}\n')
    return broken


# ---- processes ----------------------------------------------------------------------------------
class Snakemake:
    """One snakemake process in its own session, its output in <project>/snakemake.out."""

    def __init__(self, project: Path, args: list[str], env: dict, niceness: int = 0):
        self.project, self.out_path = project, project / "snakemake.out"
        argv = ["nice", "-n", str(niceness), str(VENV_BIN / "snakemake"), *args]
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(argv, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait(self, deadline: float) -> tuple[int | None, str]:
        try:
            rc = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own process group; SLURM jobs are cancelled at teardown
            self.proc.wait(timeout=30)
            rc = None
        return rc, self.out_path.read_text()


class Canceller(threading.Thread):
    """Cancels (`scancel`) the first job of `rule` that runs in `project`, once it has run `after_s` seconds."""

    def __init__(self, project: Path, rule: str, env: dict, after_s: float = 2.0):
        super().__init__(daemon=True)
        self.project, self.rule, self.env, self.after_s = project, rule, env, after_s
        self.cancelled: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        seen: dict[str, float] = {}
        while not self.done.is_set():
            queue = subprocess.run(["squeue", "-h", "-o", "%i|%T|%k|%Z"], env=self.env, capture_output=True,
                                   text=True).stdout
            for line in queue.splitlines():
                job_id, state, comment, workdir = line.split("|", 3)
                if (state == "RUNNING" and comment.startswith(f"rule_{self.rule}_wildcards")
                        and Path(workdir).resolve() == self.project.resolve()):
                    seen.setdefault(job_id, time.monotonic())
                    if time.monotonic() - seen[job_id] >= self.after_s:
                        subprocess.run(["scancel", job_id], env=self.env, check=True)
                        self.cancelled.append(job_id)
                        return
            time.sleep(0.25)


def tail(text: str, chars: int = 6000) -> str:
    return text[-chars:]


# ---- SLURM queries ------------------------------------------------------------------------------
def submitted_jobs(output: str) -> dict[str, list[tuple[str, Path]]]:
    """rule -> [(SLURM job id, SLURM log)] from the executor's 'submitted with SLURM jobid' lines."""
    jobs: dict[str, list] = {}
    for job_id, log in re.findall(r"submitted with SLURM jobid (\d+) \(log: (\S+)\)", output):
        rule = re.search(r"/rule_(\w+?)/", log).group(1)
        jobs.setdefault(rule, []).append((job_id, Path(log)))
    return jobs


def slurm_job(job_id: str, env: dict) -> dict[str, str]:
    line = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                          check=True).stdout
    return dict(field.split("=", 1) for field in line.split() if "=" in field)


def minutes(time_limit: str) -> int:
    """SLURM's [D-]HH:MM:SS as minutes."""
    days, _, clock = time_limit.rpartition("-")
    hours, mins, _ = (int(x) for x in clock.split(":"))
    return int(days or 0) * 1440 + hours * 60 + mins


def megabytes(size: str) -> int:
    """scontrol's 1000M / 62.50G as MB."""
    return round(float(size[:-1]) * {"M": 1, "G": 1024, "T": 1024 ** 2}[size[-1]])


def profile_resources() -> dict[str, dict]:
    """The profile's set-resources, expressions evaluated for a first attempt."""
    resources = yaml.safe_load(PROFILE.read_text())["set-resources"]
    return {rule: {k: eval(v, {"attempt": 1}) if isinstance(v, str) and "attempt" in v else v
                   for k, v in values.items()} for rule, values in resources.items()}


def planned_limits(params: dict, rules: tuple[str, ...]) -> dict[str, int]:
    """rule -> the first-attempt time limit `hnclip plan` gives the one job of that rule (the rules book it)."""
    plan = build_plan(Registry(params))
    limits = {job.rule: plan.time_limit_min(job.name) for job in plan.jobs.values() if job.rule in rules}
    assert sorted(limits) == sorted(rules) and all(
        sum(job.rule == rule for job in plan.jobs.values()) == 1 for rule in rules), "one job per rule expected"
    return limits


def run_record(project: Path, rel: str) -> dict:
    return json.loads((project / rel).read_text())


# ---- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        handle = local_slurm.start_cluster(tmp_path_factory.mktemp("slurm"), cpus=32, memory_mb=256_000,
                                           gpus=2, gpu_type="a100")
    except local_slurm.ClusterError as exc:
        pytest.fail(f"could not start the local SLURM cluster: {exc}", pytrace=False)
    yield handle
    local_slurm.stop_cluster(handle)


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """The three invocations, side by side: name -> (project, return code or None on timeout, output)."""
    root = tmp_path_factory.mktemp("slurm-projects")
    params = one_table_params()
    local, slurm, failing = (make_project(root / name, params) for name in ("local", "slurm", "failing"))
    limited = make_project(root / "limited", limited_params(params))
    env = cluster.env({**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"})
    started = time.monotonic()
    generate_datasets(slurm, env)
    for project in (local, failing, limited):
        shutil.copytree(slurm / "data", project / "data")  # mtimes kept: Snakemake sees them up to date
    broken = break_pretraining_manifest(failing)
    profile = ["--profile", str(PROFILE.parent), *TEST_CLUSTER_FLAGS, *SAME_THREADS_AS_LOCAL]
    procs = {
        "slurm": Snakemake(slurm, [*profile, "--", TABLE_CSV], env),
        # Niced: the SLURM run's jobs, whose polling sets this file's duration, get the CPU first.
        "local": Snakemake(local, ["--cores", "2", TABLE_CSV], env, niceness=10),
        "failing": Snakemake(failing, [*profile, "--retries", "0", "--set-resources", *CPU_ONLY_RESOURCES,
                                       "--", f"results/backbones/{BACKBONE}/model.pt"], env),
        # The run's record only: what the partition limit and the cancellation could change is its training.
        "limited": Snakemake(limited, [*profile, "--", *map(str, map(paths.run_record, Registry(params).runs()))], env),
    }
    canceller = Canceller(limited, "train", env, after_s=1.0)  # the run's last allocation (not a `train_part`)
    canceller.start()
    deadline = started + RUN_TIMEOUT_S
    results = {name: (proc.project, *proc.wait(deadline)) for name, proc in procs.items()}
    canceller.done.set()
    print(f"SLURM test runs took {time.monotonic() - started:.0f}s")
    return {"env": env, "broken_manifest": broken, "cancelled": canceller.cancelled, **results}


# ---- tests --------------------------------------------------------------------------------------
def test_profile_gives_every_rule_resources_and_gpu_rules_a_gpu():
    profile = yaml.safe_load(PROFILE.read_text())
    assert profile["executor"] == "slurm" and profile["retries"] >= 1 and profile["rerun-incomplete"] is True
    rules = {m for smk in (ROOT / "workflow" / "rules").glob("*.smk")
             for m in re.findall(r"^rule (\w+):", smk.read_text(), re.M)}
    resources = profile_resources()
    assert rules <= set(resources), f"rules without SLURM resources: {rules - set(resources)}"
    for rule, res in resources.items():
        assert {"mem_mb", "cpus_per_task"} <= set(res), rule
        # a runtime here would replace the one the rule books from `hnclip plan`'s estimate
        assert ("runtime" in res) == (rule not in PLANNED_RULES), rule
        assert (res.get("gpu", 0) >= 1) == (rule in GPU_RULES), rule
    # the paired step timing claims every core on one machine; on a cluster, a node's share like its booking
    assert profile["set-threads"] == {"step_timing": resources["step_timing"]["cpus_per_task"]}
    rule_text = "".join(smk.read_text() for smk in (ROOT / "workflow" / "rules").glob("*.smk"))
    for rule in PLANNED_RULES:
        assert f'runtime=planned_runtime("{rule}", ' in rule_text, rule


def test_profile_books_the_plans_memory_for_the_paper_profile(params):
    """mem_mb of the model-bound rules is `hnclip plan`'s estimate for the paper profile (startup + 1.5 x
    the model's host copies), which the rules declare too (tests/test_workflow.py)."""
    planned = build_plan(Registry(params, profile="paper")).host_mem_mb()
    booked = profile_resources()
    assert {rule: booked[rule]["mem_mb"] for rule in planned} == planned == {
        "train": 33000, "evaluate": 12000, "caption_stats": 12000}   # train: + 8 loader processes (GOAL, StructXLIP)


def test_missing_packages_without_apt_is_an_error_with_the_reason(monkeypatch):
    monkeypatch.setattr(local_slurm.shutil, "which", lambda name, path=None: None)
    with pytest.raises(local_slurm.ClusterError, match="apt-get is not available to install slurmctld"):
        local_slurm.ensure_packages()


def test_slurm_run_equals_local_run(runs):
    slurm, slurm_rc, slurm_out = runs["slurm"]
    local, local_rc, local_out = runs["local"]
    assert slurm_rc == 0, tail(slurm_out)
    assert local_rc == 0, tail(local_out)
    pd.testing.assert_frame_equal(pd.read_csv(slurm / TABLE_CSV), pd.read_csv(local / TABLE_CSV))
    # Stronger than the table: the same weights, bit for bit (backbone and the fine-tuned run).
    records = [f"results/backbones/{BACKBONE}/train.json", *(str(p.relative_to(local)) for p in
                                                              local.glob("results/runs/*/train.json"))]
    assert len(records) == 2
    for rel in records:
        assert run_record(slurm, rel)["final_weights_sha256"] == run_record(local, rel)["final_weights_sha256"], rel


def test_slurm_jobs_got_the_profiles_requests(runs):
    _, slurm_rc, slurm_out = runs["slurm"]
    assert slurm_rc == 0, tail(slurm_out)
    jobs = submitted_jobs(slurm_out)
    assert {rule: len(ids) for rule, ids in jobs.items()} == {
        "pretrain_backbone": 1, "train": 1, "evaluate": 1, "table": 1}
    wanted = profile_resources()
    planned = planned_limits(one_table_params(), ("train", "evaluate", "pretrain_backbone"))
    for rule, submissions in jobs.items():
        for job_id, log in submissions:
            job = slurm_job(job_id, runs["env"])
            assert job["JobState"] == "COMPLETED", (rule, job)
            assert log.exists(), log  # kept for successful jobs too (slurm-keep-successful-logs)
            assert minutes(job["TimeLimit"]) == wanted[rule].get("runtime", planned.get(rule)), (rule, job["TimeLimit"])
            assert megabytes(job["MinMemoryNode"]) == wanted[rule]["mem_mb"], (rule, job["MinMemoryNode"])
            assert int(job["NumCPUs"]) == wanted[rule]["cpus_per_task"], (rule, job["NumCPUs"])
            typed = f"{wanted[rule]['gpu_model']}:" if wanted[rule].get("gpu_model") else ""  # none unless set
            gpu = f"gres:gpu:{typed}{wanted[rule]['gpu']}" if rule in GPU_RULES else None
            assert job.get("TresPerJob") == gpu, (rule, job.get("TresPerJob"))


def test_failing_job_is_reported_with_its_logs(runs):
    failing, rc, out = runs["failing"]
    assert rc not in (0, None), tail(out)
    assert "Error in rule pretrain_backbone" in out, tail(out)
    assert re.search(r"SLURM status is: 'FAILED'", out), tail(out)
    rule_log = f"logs/backbones/{BACKBONE}.log"
    slurm_log = re.search(r"\S+/logs/slurm/rule_pretrain_backbone/\S+\.log", out)
    assert rule_log in out and slurm_log, tail(out)
    # The command's log holds the exception: it ran and failed inside the SLURM job.
    assert str(runs["broken_manifest"].relative_to(failing)) in (failing / rule_log).read_text()
    assert Path(slurm_log.group(0)).exists()
    (job_id, _), = submitted_jobs(out)["pretrain_backbone"]
    job = slurm_job(job_id, runs["env"])
    assert job["JobState"] == "FAILED" and job["ExitCode"] != "0:0"
    assert "TresPerJob" not in job and megabytes(job["MinMemoryNode"]) == 1000  # the CPU-only override
    assert not (failing / f"results/backbones/{BACKBONE}/model.pt").exists()


def test_a_run_over_the_partition_limit_trains_in_allocations_within_it_and_survives_scancel(runs):
    """No allocation over the partition limit: the run is booked as two one-epoch allocations (its whole
    limit is twice the partition's); its last allocation, cancelled while it ran, is resubmitted and resumes
    from the first's checkpoint; and the weights are the unconstrained run's, bit for bit."""
    limited, rc, out = runs["limited"]
    slurm, slurm_rc, slurm_out = runs["slurm"]
    assert rc == 0 and slurm_rc == 0, tail(out) + tail(slurm_out)
    (run,) = Registry(one_table_params()).runs()
    unconstrained = build_plan(Registry({**limited_params(one_table_params()), "planning": {
        **limited_params(one_table_params())["planning"], "partition_limit": None}}))
    assert unconstrained.time_limit_min(f"train:{run}") == 2 * LIMIT_MIN  # the run alone would need twice the limit
    jobs = submitted_jobs(out)
    assert {rule: len(ids) for rule, ids in jobs.items()} == {"pretrain_backbone": 1, "train_part": 1, "train": 2}
    for rule, submissions in jobs.items():
        for job_id, _ in submissions:
            job = slurm_job(job_id, runs["env"])
            assert minutes(job["TimeLimit"]) <= LIMIT_MIN, (rule, job["TimeLimit"])
            assert job["JobState"] == ("CANCELLED" if job_id in runs["cancelled"] else "COMPLETED"), (rule, job)
    assert runs["cancelled"] == [jobs["train"][0][0]]  # the last allocation's first submission
    record = run_record(limited, str(paths.run_record(run)))
    assert record["training"]["resume"] is not None and [entry["epoch"] for entry in record["history"]][-1] == 2
    assert record["final_weights_sha256"] == run_record(slurm, str(paths.run_record(run)))["final_weights_sha256"]
