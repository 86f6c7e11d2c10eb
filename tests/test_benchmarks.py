"""The benchmark scripts run at their small CPU shapes and append JSON lines with the fields the
README table and the issue's closing note are built from."""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# The scripts import each other by module name, as when run from benchmarks/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
command1_costs = importlib.import_module("command1_costs")
import_times = importlib.import_module("import_times")
recall_large = importlib.import_module("recall_large")
run_overheads = importlib.import_module("run_overheads")
throughput = importlib.import_module("throughput")
token_memory = importlib.import_module("token_memory")
token_term_profile = importlib.import_module("token_term_profile")

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny shapes, one thread

ENVIRONMENT = {"device", "device_name", "threads", "libraries", "git", "timestamp"}


@pytest.fixture(autouse=True)
def short_machine_speed_probe(monkeypatch):
    """The benchmarks' machine-speed probe runs GEMMs for 2 s per call; here 0.05 s: these tests check that
    the speed is recorded, not what it is, and the suite's other worker shares the cores meanwhile."""
    probe = command1_costs.gemm_gflops

    def short(seconds: float = 2.0) -> float:
        return probe(min(seconds, 0.05))
    monkeypatch.setattr(command1_costs, "gemm_gflops", short)
    monkeypatch.setattr(import_times, "gemm_gflops", short)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_environment(record: dict) -> None:
    assert ENVIRONMENT <= record.keys()
    assert record["libraries"]["torch"] and record["libraries"]["open_clip_torch"]
    assert "commit" in record["git"]


def test_throughput_records_both_modes(tmp_path):
    out = tmp_path / "throughput.jsonl"
    out.write_text(json.dumps({"earlier": "line"}) + "\n")  # appended to, not replaced
    returned = throughput.main(["--small", "--steps", "1", "--warmup", "0", "--methods", "plain,hnclip",
                                "--out", str(out)])
    lines = read_lines(out)
    assert lines[0] == {"earlier": "line"} and lines[1:] == json.loads(json.dumps(returned))
    records = lines[1:]
    assert [(r["method"], r["mode"]) for r in records] == [
        ("plain", "accumulate"), ("plain", "compute_batch"), ("hnclip", "accumulate"), ("hnclip", "compute_batch")]
    for record in records:
        assert_environment(record)
        assert record["device"] == "cpu" and record["precision"] == "fp32"
        assert record["img_per_s"] == pytest.approx(8 / record["step_s_median"])  # 4 x 2 pairs per step
        assert record["peak_mem_gb"] > 0
        shapes = record["shapes"]
        assert (shapes["model"], shapes["image_size"], shapes["micro_batch"], shapes["grad_accum"]) == \
            ("hnclip-tiny", 64, 4, 2)
        assert shapes["compute_batch"] == (8 if record["mode"] == "compute_batch" else None)
        assert record["pairs_per_forward"] == (8 if record["mode"] == "compute_batch" else 4)
        # the new execution path, as it applies on a CPU: causal text attention, torch's default AdamW
        assert (record["text_attention"], record["fused_adamw"], record["compile"]) == ("causal flag", False, False)
        assert len(record["first_step_losses"]) == 2 and all(loss > 0 for loss in record["first_step_losses"])
    assert records[2]["objective"] == {"framework": "full", "gamma": 0.5, "lambda_tok": 1.0, "margin": "live",
                                       "margin_control": "none"}


def test_throughput_rejects_unknown_methods(tmp_path):
    with pytest.raises(SystemExit):
        throughput.main(["--small", "--methods", "plain,nope", "--out", str(tmp_path / "x.jsonl")])


def test_throughput_covers_the_baselines_and_evaluation(tmp_path):
    """FineLIP, GOAL and StructXLIP run one micro-batch per forward (their compute_batch request is skipped)
    at their paper precision (fp32 on a CPU); `evaluate` encodes a test set; the earlier text attention
    (`--text-attention mask`) gives the same first-step losses as the causal flag."""
    out = tmp_path / "throughput.jsonl"
    records = throughput.main(["--small", "--steps", "1", "--warmup", "0", "--eval-images", "8", "--eval-batch", "4",
                               "--methods", "finelip,goal,structxlip,evaluate", "--out", str(out)])
    assert read_lines(out) == json.loads(json.dumps(records))
    assert [(r["method"], r["framework"], r["mode"]) for r in records] == [
        ("finelip", "finelip", "accumulate"), ("goal", "goal", "accumulate"),
        ("structxlip", "structxlip", "accumulate"), ("evaluate", "none", "evaluate")]
    for record in records[:3]:
        assert_environment(record)
        assert (record["pairs_per_forward"], record["precision"]) == (4, "fp32")
        assert record["img_per_s"] == pytest.approx(8 / record["step_s_median"])
    assert [r["paper_precision"] for r in records[:3]] == ["fp32", "bf16", "bf16"]  # params.yaml's paper profile
    assert records[3]["img_per_s"] == pytest.approx(8 / records[3]["step_s_median"])
    assert (records[3]["eval_images"], records[3]["pairs_per_forward"], records[3]["precision"]) == (8, 4, "fp32")
    masked = throughput.main(["--small", "--steps", "1", "--warmup", "0", "--methods", "plain", "--modes", "accumulate",
                              "--text-attention", "mask", "--adamw", "default", "--out", str(out)])
    causal = throughput.main(["--small", "--steps", "1", "--warmup", "0", "--methods", "plain", "--modes", "accumulate",
                              "--out", str(out)])
    assert (masked[0]["text_attention"], causal[0]["text_attention"]) == ("float mask", "causal flag")
    assert masked[0]["adamw_option"] == "default"
    assert masked[0]["first_step_losses"] == pytest.approx(causal[0]["first_step_losses"], abs=1e-5)


def test_token_term_profile_compares_the_implementations(tmp_path):
    out = tmp_path / "token_term_profile.jsonl"
    record = token_term_profile.main(["--small", "--term-only", "--repeats", "1", "--out", str(out)])
    assert read_lines(out) == [json.loads(json.dumps(record))]
    assert_environment(record)
    assert set(record["implementations"]) == {"previous", "current"}
    assert all(value <= 1e-6 for value in record["max_abs_difference_current_vs_previous"].values())
    previous, current = record["implementations"]["previous"], record["implementations"]["current"]
    assert current["saved_bytes"] < previous["saved_bytes"]  # no cosines kept for backward
    assert len(current["term_s"]) == 1 and current["term_s_median"] > 0


def test_throughput_captions_have_the_requested_lengths():
    shapes = throughput.Shapes("hnclip-tiny", 8, caption_tokens=50, micro_batch=3, grad_accum=2, compute_batch=6)
    batches = throughput.random_inputs(shapes, torch.device("cpu"))
    assert [tuple(images.shape) for images, _ in batches] == [(3, 3, 8, 8)] * 2
    for _, tokens in batches:
        for row in tokens:
            length = int((row != 0).sum())
            assert 40 <= length <= 60  # 50 +- 20 %
            assert row[0] == throughput.SOT and row[length - 1] == throughput.EOT
            assert int(row[1:length - 1].max()) < throughput.SOT and not row[length:].any()


def test_token_memory_records(tmp_path):
    out = tmp_path / "token_memory.jsonl"
    token_memory.main(["--small", "--out", str(out)])
    records = read_lines(out)
    assert [(r["config"], r["batch"], r["groups"]) for r in records] == [
        ("naive", 4, 1), ("training", 4, 1), ("block_diagonal", 8, 2)]
    # SMALL: T=16, P=17, E=32, groups of 4: B x B x T x P x 4 bytes
    assert [r["naive_tensor_bytes"] for r in records] == [4 * 4 * 16 * 17 * 4, 4 * 4 * 16 * 17 * 4, 8 * 8 * 16 * 17 * 4]
    assert records[2]["naive_block_diagonal_bytes"] == 2 * 4 * 4 * 16 * 17 * 4
    assert records[2]["input_grad_bytes"] == 8 * (17 + 16) * 32 * 4
    for record in records:
        assert_environment(record)
        if token_memory.peak_memory_supported():
            assert record["measured_peak_bytes"] >= 0
        else:
            assert record["measured_peak_bytes"] is None


def test_recall_large_record(tmp_path):
    out = tmp_path / "recall_large.jsonl"
    recall_large.main(["--small", "--repeats", "1", "--out", str(out)])
    (record,) = read_lines(out)
    assert_environment(record)
    assert (record["n"], record["dim"], record["goal_s"]) == (500, 768, 1.0)
    assert record["median_s"] > 0 and record["meets_goal"] == (record["median_s"] <= 1.0)


def _benchmark_file(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("s\th:m:s\tmax_rss\n" f"{seconds}\t0:00:00\t10.0\n")


def _train_record(project: Path, run: str, framework: str, train_s: float, eval_s: float, probe_s: float,
                  micro_batches: list[int]) -> None:
    path = project / "results" / "runs" / run / "train.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"wall_time_s": 1.0, "history": [{"train": {"micro_batches": n}} for n in micro_batches],
                                "training": {"framework": framework,
                                             "timing_s": {"train_s": train_s, "eval_s": eval_s, "probe_s": probe_s}}}))


def test_command1_costs_splits_job_time_and_bounds_the_cold_run(tmp_path):
    """Job seconds per stage from the Snakemake benchmark files, each training job split by its own record
    (a probe is timed inside its optimizer step), and the bound: pretraining + step seconds / cores."""
    project = tmp_path / "proj"
    _benchmark_file(project / "logs" / "backbones" / "tiny_pretrained.benchmark.tsv", 300.0)
    _benchmark_file(project / "logs" / "train" / "a.benchmark.tsv", 50.0)
    _benchmark_file(project / "logs" / "train" / "b.benchmark.tsv", 100.0)
    _benchmark_file(project / "logs" / "evals" / "a" / "docci.benchmark.tsv", 2.0)
    _benchmark_file(project / "logs" / "tiny" / "auxiliary" / "docci.segments.benchmark.tsv", 7.0)
    _benchmark_file(project / "logs" / "tiny" / "claims.benchmark.tsv", 1.0)
    _benchmark_file(project / "logs" / "tiny" / "stats" / "step_timing.benchmark.tsv", 20.0)  # runs alone
    _train_record(project, "a", "full", train_s=40.0, eval_s=6.0, probe_s=10.0, micro_batches=[32, 32])
    _train_record(project, "b", "goal", train_s=80.0, eval_s=12.0, probe_s=0.0, micro_batches=[32, 32])
    out = tmp_path / "costs.jsonl"
    record = command1_costs.main(["--project", str(project), "--cores", "2", "--cold-s", "400", "--out", str(out)])
    assert read_lines(out) == [json.loads(json.dumps(record))]
    assert record["stages"] == {"auxiliary": {"jobs": 1, "job_s": 7.0}, "backbones": {"jobs": 1, "job_s": 300.0},
                                "claims": {"jobs": 1, "job_s": 1.0}, "evals": {"jobs": 1, "job_s": 2.0},
                                "stats": {"jobs": 1, "job_s": 20.0}, "train": {"jobs": 2, "job_s": 150.0}}
    full, goal = record["training"]["full"], record["training"]["goal"]
    assert (full["steps_s"], full["probe_s"], full["eval_s"], full["other_s"]) == (30.0, 10.0, 6.0, 4.0)
    assert full["ms_per_micro_batch"] == pytest.approx(1000 * 30 / 64, abs=0.051)  # rounded to 0.1 ms
    assert (goal["steps_s"], goal["other_s"], goal["runs"]) == (80.0, 8.0, 1)
    assert record["steps_bound_s"] == 300 + (30 + 80) / 2
    assert record["step_timing_s"] == 20.0
    assert record["compute_bound_s"] == 300 + 20 + (30 + 80 + 6 + 12) / 2
    assert record["total_job_s"] == 480.0 and record["gemm_gflops_1thread"] > 0  # the machine's speed, recorded
    assert record["core_utilisation"] == pytest.approx((480 - 300) / (2 * 100), abs=1e-3)
    with pytest.raises(SystemExit):
        command1_costs.main(["--project", str(tmp_path / "nothing"), "--out", str(out)])
    assert "matrix_steps_bound_s" not in record  # no params.yaml: nothing planned to bound

    # the whole planned matrix from a partial run: each framework's planned micro-batches at its measured cost
    planned = {"full": 640, "goal": 128}
    assert command1_costs.matrix_steps_bound(record["training"], planned, 300.0, 2) == \
        pytest.approx(300 + (640 * 30 / 64 + 128 * 80 / 64) / 2, abs=0.05)
    assert command1_costs.matrix_steps_bound(record["training"], {**planned, "lora": 10}, 300.0, 2) is None


def test_run_overheads_records_evaluation_probe_and_checkpoint_costs(tmp_path):
    out = tmp_path / "overheads.jsonl"
    record = run_overheads.main(["--repeats", "1", "--test-size", "8", "--batch-sizes", "8,4",
                                 "--model-config", "hnclip-tiny", "--out", str(out)])
    assert read_lines(out) == [json.loads(json.dumps(record))]
    assert set(record["eval_s"]) == {"docci_test", "long_dci_test"}
    for split in record["eval_s"].values():
        assert set(split) == {"8", "4"} and all(t["images"] > 0 and t["captions"] > 0 for t in split.values())
    # both probe variants timed (which costs more is the benchmark's finding, not a test's: one repeat on shared
    # cores can order them either way)
    assert set(record["probe_s"]) == {"with_bf16", "without_bf16"} and min(record["probe_s"].values()) > 0
    assert record["model_config"] == "hnclip-tiny" and record["resume_checkpoint_mb"] > 0
    assert record["gemm_gflops_1thread"] > 0 and record["commit"]


def test_import_times_compares_compiled_modules_with_compiling_from_source(tmp_path):
    out = tmp_path / "imports.jsonl"
    record = import_times.main(["--modules", "json,colorsys", "--repeats", "1", "--out", str(out)])
    assert read_lines(out) == [json.loads(json.dumps(record))]
    assert set(record["median_s"]) == {"json", "colorsys"}
    for module, by_condition in record["median_s"].items():
        assert set(by_condition) == {"compiled", "from_source"} and min(by_condition.values()) > 0
        assert record["from_source_extra_s"][module] == pytest.approx(
            by_condition["from_source"] - by_condition["compiled"], abs=1e-3)
    assert record["from_source_wrote_nothing"] is True and record["git"]["commit"]
    assert record["gemm_gflops_1thread"]["before"] > 0 and record["gemm_gflops_1thread"]["after"] > 0


def test_import_times_from_source_finds_and_writes_no_compiled_module(tmp_path, monkeypatch):
    """The `from_source` condition: no bytecode written, and none read (its cache prefix is empty);
    the `compiled` one: the interpreter's defaults, whatever the caller's environment says."""
    import subprocess
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "callers"))
    probe = "import sys; print(sys.flags.dont_write_bytecode, sys.pycache_prefix)"
    flags = {condition: subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                       env=import_times.condition_env(condition, tmp_path / "empty")).stdout.split()
             for condition in import_times.CONDITIONS}
    assert flags["from_source"] == ["1", str(tmp_path / "empty")]
    assert flags["compiled"][1] == "None"


def test_import_times_compiles_only_the_projects_modules_from_source_in_its_own_condition(tmp_path):
    """`project_from_source`: measured for the project's modules only, from a bytecode-free copy that
    stays free of bytecode; the copy is what the import reads."""
    import subprocess
    assert import_times.conditions_of("json") == ("compiled", "from_source")
    out = str(tmp_path / "i.jsonl")
    record = import_times.main(["--modules", "json,hnclip.errors", "--repeats", "1", "--out", out])
    assert set(record["median_s"]["hnclip.errors"]) == set(import_times.CONDITIONS)
    assert set(record["project_from_source_extra_s"]) == {"hnclip.errors"}
    assert record["from_source_wrote_nothing"] is True
    env = import_times.condition_env("project_from_source", tmp_path / "empty", tmp_path / "copy")
    where = subprocess.run([sys.executable, "-c", "import sys; print(sys.flags.dont_write_bytecode, sys.path[1])"],
                           capture_output=True, text=True, check=True, env=env).stdout.split()
    assert where == ["1", str(tmp_path / "copy")]


def test_command1_costs_plans_the_micro_batches_of_every_run(project_root):
    """The committed params.yaml: every planned run's micro-batches, per framework, as the loop counts them."""
    planned = command1_costs.planned_micro_batches(project_root)
    assert set(planned) == {"full", "lora", "dora", "finelip", "goal", "structxlip"}
    assert planned["finelip"] == 6 * 512 // 16 * 4  # 6 runs on 512-scene training sets, 4 epochs


def test_pretrain_wait_policy_choice_keeps_quiet_speed_and_prefers_speed_under_load():
    wait_policy = importlib.import_module("pretrain_wait_policy")
    conditions = [{"policy": p, "load": load, "s_per_step": s} for p, load, s in (
        ("ACTIVE", "quiet", 0.50), ("PASSIVE", "quiet", 0.54), ("ACTIVE", "busy", 1.40), ("PASSIVE", "busy", 0.80),
        ("ACTIVE", "quiet", 0.52), ("PASSIVE", "quiet", 0.56), ("ACTIVE", "busy", 1.20), ("PASSIVE", "busy", 0.90))]
    choice = wait_policy.choose(conditions, 0.10)
    assert choice["s_per_step"] == {"quiet": {"ACTIVE": pytest.approx(0.51), "PASSIVE": pytest.approx(0.55)},
                                    "busy": {"ACTIVE": pytest.approx(1.30), "PASSIVE": pytest.approx(0.85)}}
    assert choice["quiet_loss_vs_fastest"]["PASSIVE"] == pytest.approx(0.55 / 0.51 - 1)
    assert choice["busy_slowdown"]["ACTIVE"] == pytest.approx(1.30 / 0.51)
    assert (choice["eligible"], choice["chosen"]) == (["ACTIVE", "PASSIVE"], "PASSIVE")
    # a policy more than 10 % slower on a quiet machine is not chosen, however it does under load
    assert wait_policy.choose(conditions, 0.05)["chosen"] == "ACTIVE"


def test_pretrain_wait_policy_records_each_condition_and_the_machine(tmp_path, monkeypatch):
    """A tiny run: one optimizer step of the adopted backbone per condition, each in its own process (one
    policy, the OpenMP runtime's default, to keep it short). The busy condition's competing process sleeps
    instead of spinning: what is checked is that it is started and stopped around the condition, and a
    spinning one would take a core from the tests running beside this one."""
    wait_policy = importlib.import_module("pretrain_wait_policy")
    sleeper = "import time\ntime.sleep(600)"
    monkeypatch.setattr(wait_policy, "BUSY_LOOP", sleeper)
    started = []

    class RecordedPopen(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            super().__init__(args, *rest, **kwargs)
            started.append(self)
    monkeypatch.setattr(wait_policy.subprocess, "Popen", RecordedPopen)
    out = tmp_path / "wait_policy.jsonl"
    record = wait_policy.main(["--steps", "1", "--threads", "1", "--policies", "unset", "--gemm-seconds", "0.2",
                               "--scratch", str(tmp_path / "scratch"), "--out", str(out)])
    assert read_lines(out) == [json.loads(json.dumps(record))]
    assert record["benchmark"] == "pretrain_wait_policy" and "commit" in record["git"]
    assert record["libraries"]["torch"] and record["backbone"]["name"] == "tiny_pretrained"
    assert (record["steps"], record["threads"], record["cpus"]) == (1, 1, os.cpu_count())
    assert record["gemm_gflops_1thread"] > 0 and record["gemm_gflops_1thread_after"] > 0
    assert [(c["policy"], c["load"]) for c in record["conditions"]] == [("unset", "quiet"), ("unset", "busy")]
    for condition in record["conditions"]:
        assert condition["optimizer_steps"] == 1 and 0 < condition["s_per_step"] == condition["train_s"]
        assert condition["job_wall_s"] >= condition["train_s"]
        assert condition["omp_wait_policy"] is None  # unset in the condition's process, whatever the caller's
    assert record["chosen"] == "unset"
    competing = [proc for proc in started if sleeper in proc.args]
    assert len(competing) == 1 and competing[0].returncode == -signal.SIGKILL  # killed when its condition ended
    assert record["s_per_step"]["busy"]["unset"] == record["conditions"][1]["s_per_step"]
    with pytest.raises(SystemExit):
        wait_policy.main(["--policies", "SPIN", "--out", str(out)])


@pytest.mark.skipif(not (Path(sys.executable).parent / "snakemake").exists(), reason="snakemake is not in the venv")
def test_pretraining_runs_with_the_wait_policy_params_yaml_sets(empty_project, params):
    """The policy the benchmark chooses is a setting (`execution.pretrain_wait_policy`), not a literal of the rule."""
    import subprocess

    import yaml
    params["profiles"]["tiny"]["execution"]["pretrain_wait_policy"] = "PASSIVE"
    (empty_project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (empty_project / "Snakefile").symlink_to(Path(__file__).resolve().parents[1] / "Snakefile")
    out = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "-n", "-p", "--cores", "2",
                          "results/backbones/tiny_pretrained/model.pt"], cwd=empty_project, capture_output=True,
                         text=True, check=True).stdout
    (command,) = [line.strip() for line in out.splitlines() if " pretrain --backbone tiny_pretrained" in line]
    assert command.removeprefix("Shell command:").strip().startswith("OMP_WAIT_POLICY=PASSIVE ")


# ---- CI's wall time on a fresh clone -------------------------------------------------------------------
CI_TRANSCRIPT = """setup: building .venv from requirements.lock (first time: ~1.5 min, ~6 GB)
setup: packages installed in 54 s (3 pip processes)
setup: byte-compiled in 24 s
setup: done
........................................................................ [ 94%]
============================= slowest 3 durations =============================
264.36s setup    tests/test_paper_rehearsal.py::test_rehearsal_writes_every_table
37.02s call     tests/test_benchmarks.py::test_pretrain_wait_policy[a b]
0.01s teardown tests/test_x.py::test_y
2 failed, 983 passed, 3 skipped, 1 xfailed, 2 warnings in 617.85s (0:10:17)"""


def test_ci_walltime_reads_setup_outcome_and_slowest_tests_from_the_transcript():
    ci_walltime = importlib.import_module("ci_walltime")
    lines = [(10.0 * i, text) for i, text in enumerate(CI_TRANSCRIPT.splitlines())]
    assert ci_walltime.phases(lines) == {
        "setup_s": 30.0, "install_s": 54, "compile_s": 24, "pytest_s": 617.85,
        "outcome": {"failed": 2, "passed": 983, "skipped": 3, "xfailed": 1, "warnings": 2},
        "slowest": [{"s": 264.36, "phase": "setup",
                     "test": "tests/test_paper_rehearsal.py::test_rehearsal_writes_every_table"},
                    {"s": 37.02, "phase": "call", "test": "tests/test_benchmarks.py::test_pretrain_wait_policy[a b]"},
                    {"s": 0.01, "phase": "teardown", "test": "tests/test_x.py::test_y"}]}
    # setup failed: nothing of pytest, and no end of setup
    assert ci_walltime.phases(lines[:2]) == {"setup_s": None, "install_s": 54, "compile_s": None, "pytest_s": None,
                                             "outcome": {}, "slowest": []}


GIT_IDENTITY = ("-c", "user.name=t", "-c", "user.email=t@t")  # repo-local: CI has no git identity


def git_repository(path: Path, files: dict[str, str]) -> Path:
    """A one-commit repository of `files` (with an executable .ci/run)."""
    git = importlib.import_module("ci_walltime").git
    path.mkdir()
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    (path / ".ci" / "run").chmod(0o755)
    for command in (["init", "-q"], ["add", "-A"], [*GIT_IDENTITY, "commit", "-qm", "ci"]):
        git(path, *command)
    return path


def test_ci_walltime_runs_the_ci_command_on_a_clone_of_head_and_records_its_phases(tmp_path, monkeypatch):
    """A repository whose `.ci/run` prints setup.sh's lines and runs pytest on two tests: the record has
    the commit, the setup phases, the outcome and the slowest test (the --durations the script passes
    through PYTEST_ADDOPTS); a failing suite is recorded too, with its exit status."""
    ci_walltime = importlib.import_module("ci_walltime")
    ci_run = "\n".join(["#!/usr/bin/env bash", "set -euo pipefail", "echo 'setup: packages installed in 3 s'",
                        "echo 'setup: byte-compiled in 1 s'", "echo 'setup: done'",
                        f"exec {sys.executable} -m pytest -q -p no:cacheprovider tests", ""])
    suite = "import time\n\ndef test_slow():\n    time.sleep(0.3)\n\ndef test_fast():\n    assert {verdict}\n"
    repo = git_repository(tmp_path / "repo", {".ci/run": ci_run, "tests/test_suite.py": suite.format(verdict="True")})
    (repo / "uncommitted.txt").write_text("not in the clone")
    out, scratch = tmp_path / "ci.jsonl", tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    args = ["--repo", str(repo), "--out", str(out), "--slowest", "1", "--gemm-seconds", "0.05"]
    assert ci_walltime.main(args) == 0
    (record,) = read_lines(out)
    assert record["commit"] == ci_walltime.git(repo, "rev-parse", "HEAD")
    assert (record["exit_status"], record["uncommitted_files"]) == (0, 1)
    assert (record["install_s"], record["compile_s"]) == (3, 1)
    assert record["outcome"] == {"passed": 2}
    (slowest,) = record["slowest"]
    assert slowest["test"] == "tests/test_suite.py::test_slow" and slowest["s"] >= 0.3
    assert 0 <= record["setup_s"] <= record["wall_s"] and record["gemm_gflops_1thread"]["after"] > 0
    assert list(scratch.iterdir()) == []  # the clone is removed

    (repo / "tests" / "test_suite.py").write_text(suite.format(verdict="False"))
    ci_walltime.git(repo, *GIT_IDENTITY, "commit", "-qam", "break")
    assert ci_walltime.main(args) == 1
    failed = read_lines(out)[1]
    assert failed["exit_status"] == 1 and failed["outcome"] == {"failed": 1, "passed": 1}


def test_the_regime_sweeps_oracle_batches_siblings_together():
    """benchmarks/regime_sweep.py's oracle: every micro-batch holds whole families, reshuffled each epoch."""
    import regime_sweep
    families = [[2 * k, 2 * k + 1] for k in range(32)]   # 64 rows in families of 2
    epoch0 = regime_sweep.sibling_micro_batches(families, list(range(64)), 16, seed=42, epoch=0)
    assert len(epoch0) == 4 and sorted(i for batch in epoch0 for i in batch) == list(range(64))
    assert all({i // 2 for i in batch} == {i // 2 for i in batch if i % 2 == 0} and len({i // 2 for i in batch}) == 8
               for batch in epoch0)  # 8 whole families in each
    assert epoch0 == regime_sweep.sibling_micro_batches(families, list(range(64)), 16, seed=42, epoch=0)
    assert epoch0 != regime_sweep.sibling_micro_batches(families, list(range(64)), 16, seed=42, epoch=1)
