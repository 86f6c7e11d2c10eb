"""A real micro project (git + DVC, test_workflow's micro params cut to Tables 3a, 1 and 3c), built once per session.

The artifacts are made by the same `hnclip` verbs the workflow rules call, in one process (the full
`dvc repro` DAG, with its stats, figures and derived tables, is test_workflow's subject and takes
minutes); `dvc commit` then writes the dvc.lock that `dvc repro` would. Tests that need real
artifacts (tables, evaluations, checkpoints, manifests, dvc.lock) use `micro_project` and copy it
with `copy_project` before changing anything, so each case starts clean.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from test_workflow import ROOT, VENV_BIN, micro_params, run

PROJECT_FILES = ("Snakefile", "dvc.yaml", ".gitignore", ".dvcignore")


def _figure_tables(figure: dict) -> set[str]:
    return {figure["table"]} if "table" in figure else {s["table"] for s in figure.get("series", [])}


def lineage_params() -> dict:
    """test_workflow's micro params cut to Table 3a with one gamma: one row still trains a run per
    training set (docci, dci, vg), which is all lineage and audit need. Figures drawn from the tables
    dropped here are dropped too (the registry rejects a figure of an unknown table)."""
    params = micro_params()
    full = __import__("yaml").safe_load((ROOT / "params.yaml").read_text())["tables"]
    params["tables"] = {"table3a": params["tables"]["table3a"], "table1": params["tables"]["table1"],
                        "table3c": full["table3c"]}
    params["tables"]["table3a"]["vary"]["gamma"] = [0.5]
    # Table 1 (zero-shot and HN-CLIP rows) and Table 3c (recomputed vs frozen G) on DOCCI only:
    # one extra training run (frozen G) and one zero-shot evaluation.
    params["tables"]["table1"]["rows"] = [r for r in params["tables"]["table1"]["rows"]
                                          if r["key"] in ("longclip_zeroshot", "hn_clip")]
    for name in ("table1", "table3c"):
        params["tables"][name]["benchmarks"] = ["docci"]
    params["figures"] = {name: figure for name, figure in params.get("figures", {}).items()
                         if _figure_tables(figure) and _figure_tables(figure) <= set(params["tables"])}
    return params


# Table 3a through the `hnclip` verbs the workflow rules call (data -> pretrain -> train -> evaluate ->
# table), in one process: one torch import instead of one per job, so it takes about a minute.
BUILD_TABLE3A = """
from hnclip.cli import main
from hnclip.config.params import load_params
from hnclip.config.registry import Registry

reg = Registry(load_params("params.yaml"), validate=False)

def step(*argv):
    if main(["--threads", "2", *argv]) != 0:
        raise SystemExit(f"hnclip {' '.join(argv)} failed")

for role in [*reg.used_datasets(), "pretrain"]:
    step("data", role)
step("pretrain")
for run_id in sorted(reg.runs()):
    step("train", "--run", run_id)
for run_id, benchmark in reg.evaluations():
    step("evaluate", "--run", run_id, "--benchmark", benchmark)
for table in reg.tables:
    step("table", table)
"""


def build_micro_project(proj: Path) -> Path:
    """Lay out a fresh project in `proj`, commit it, build Table 3a and record dvc.lock."""
    proj.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "workflow", proj / "workflow")
    shutil.copytree(ROOT / ".dvc", proj / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    # A copy, not a link: dvc.lock hashes src/hnclip, and edits made to the live tree while the
    # tests run must not look like "code changed since dvc repro". The build still imports the
    # installed (editable) package.
    shutil.copytree(ROOT / "src" / "hnclip", proj / "src" / "hnclip", ignore=shutil.ignore_patterns("__pycache__"))
    (proj / ".venv").symlink_to(VENV_BIN.parent)
    (proj / "params.yaml").write_text(yaml.safe_dump(lineage_params(), sort_keys=False))
    run("git init -q && git add -A && git commit -qm init", proj)
    run([str(VENV_BIN / "python"), "-c", BUILD_TABLE3A], proj)
    # The lock `dvc repro` would write, for the outputs as they are: what the audit compares against.
    (proj / "results" / "stats").mkdir(exist_ok=True)
    (proj / "figures").mkdir(exist_ok=True)
    run(".venv/bin/dvc commit -f -q", proj)
    return proj


def _skip_dvc_cache_and_tmp(directory: str, names: list[str]) -> list[str]:
    """DVC's cache and tmp state are not needed to audit a copy (`dvc status` re-hashes the workspace)."""
    return [n for n in names if n in ("cache", "tmp")] if Path(directory).name == ".dvc" else []


def copy_project(source: Path, dest: Path) -> Path:
    """An independent copy (own git repo, own DVC state; mtimes kept) to tamper with."""
    shutil.copytree(source, dest, symlinks=True, ignore=_skip_dvc_cache_and_tmp)
    return dest


@pytest.fixture(scope="session")
def micro_project(tmp_path_factory) -> Path:
    return build_micro_project(tmp_path_factory.mktemp("micro") / "proj")
