"""Micro projects: the embedded profile cut down to minutes, as fresh git + DVC repositories.

`micro_params` is the end-to-end workflow's params (test_workflow, test_slurm). `build_micro_project`
makes Tables 3a, 1 and 3c and every other output DVC tracks (caption stats, effects, claims, metrics;
no figures) with the same `hnclip` verbs the workflow rules call, in one process (the full
`dvc repro` DAG is test_workflow's subject and takes minutes); `dvc commit` then writes the dvc.lock
that `dvc repro` would. The
`micro_project` fixture (conftest.py) builds one per session; tests that change anything work on a
`copy_project` of it, so each case starts clean.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PROJECT_FILES = ("Snakefile", "dvc.yaml", ".gitignore", ".dvcignore")
MICRO_TABLE1_ROWS = ("longclip_zeroshot", "hn_clip")   # Table 1's rows in a micro project


def micro_params() -> dict:
    """The embedded (tiny) profile at micro sizes, one seed, Tables 1 and 3a (gamma 0 and 0.5) and their figures."""
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
    params["backbones"]["tiny_pretrained"]["model_config"] = "hnclip-tiny"  # width 64: the DAG, not the regime
    params["tables"] = {name: params["tables"][name] for name in ("table1", "table3a")}
    kept = {None, "table1", "table3a"}
    params["figures"] = {name: spec for name, spec in params["figures"].items()
                         if {spec.get("table"), *(s["table"] for s in spec.get("series", []))} <= kept}
    params["tables"]["table3a"]["vary"]["gamma"] = [0.0, 0.5]
    # Table 1 on the DOCCI training set, with its zero-shot and HN-CLIP rows: the machinery baselines (their
    # trainings and auxiliary-input jobs) train through the same rules in the paper rehearsal
    # (test_paper_rehearsal), and would add minutes here, not coverage.
    params["tables"]["table1"]["benchmarks"] = ["docci"]
    params["tables"]["table1"]["rows"] = [row for row in params["tables"]["table1"]["rows"]
                                          if row["key"] in MICRO_TABLE1_ROWS]
    return params


def run(cmd, cwd, check=True):
    """A shell command (str) or argv (list) in `cwd`, with a repo-local git identity and no DVC analytics."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, shell=isinstance(cmd, str))
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _figure_tables(figure: dict) -> set[str]:
    return {figure["table"]} if "table" in figure else {s["table"] for s in figure.get("series", [])}


def lineage_params() -> dict:
    """`micro_params` cut to Table 3a with one gamma: one row still trains a run per
    training set (docci, dci, vg), which is all lineage and audit need. Figures drawn from the tables
    dropped here are dropped too (the registry rejects a figure of an unknown table)."""
    params = micro_params()
    full = yaml.safe_load((ROOT / "params.yaml").read_text())["tables"]
    params["tables"] = {"table3a": params["tables"]["table3a"], "table1": params["tables"]["table1"],
                        "table3c": full["table3c"]}
    params["tables"]["table3a"]["vary"]["gamma"] = [0.5]
    # Table 1 (zero-shot and HN-CLIP rows, as in micro_params) and Table 3c (recomputed vs frozen G) on DOCCI
    # only: one extra training run (frozen G) and one zero-shot evaluation.
    for name in ("table1", "table3c"):
        params["tables"][name]["benchmarks"] = ["docci"]
    params["figures"] = {name: figure for name, figure in params.get("figures", {}).items()
                         if _figure_tables(figure) and _figure_tables(figure) <= set(params["tables"])}
    # Resume checkpoints at epoch ends only (the default), not every 2 steps as in the workflow test: they
    # are deleted after each run and no lineage or audit claim reads them (run ids and records are the same
    # but for `training.checkpoints.written`); every 2 steps wrote 390 of the build's 970 MB.
    del params["profiles"]["tiny"]["execution"]["checkpoint_every_steps"]
    return params


# The tables through the `hnclip` verbs the workflow rules call (data -> pretrain -> train -> evaluate
# -> table; stats, effects, claims -> metrics), in one process: one torch import instead of one per
# job, so it takes about a minute.
BUILD_TABLES = """
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
for benchmark in reg.params["benchmarks"]:
    step("stats", "--benchmark", benchmark)
for table in reg.tables:
    step("effects", table)
step("claims")
step("metrics")
"""


def build_micro_project(proj: Path) -> Path:
    """Lay out a fresh project in `proj`, commit it, build its tables and record dvc.lock."""
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
    run([str(VENV_BIN / "python"), "-c", BUILD_TABLES], proj)
    # The lock `dvc repro` would write, for the outputs as they are (no figures are drawn): what the
    # audit compares against.
    (proj / "figures").mkdir(exist_ok=True)
    run(".venv/bin/dvc commit -f", proj)
    return proj


def _outside_the_workspace(directory: str, names: list[str]) -> list[str]:
    """The venv (linked) and DVC's cache (hard-linked) are not copied; DVC's tmp state (locks,
    indexes) is the source's own."""
    if Path(directory).name == ".dvc":
        return [n for n in names if n in ("cache", "tmp")]
    return [".venv"] if ".venv" in names else []


def copy_project(source: Path, dest: Path, share_weights: bool = False) -> Path:
    """An independent copy (own git repo, own DVC state; mtimes kept) to tamper with. DVC links the
    source's outputs to its cache (cache.type symlink): the copy gets their content, never the links,
    so that tampering with the copy cannot write through into the source's cache. The cache itself is
    hard-linked: its objects are read-only and content-addressed, never written in place.

    `share_weights`: the weights (*.pt, 125 of the copy's 132 MB) are hard links to the source's cache
    objects instead of copies. Only for a copy whose weights nothing writes in place (deleting one, or
    replacing it by a rename as `hnclip.io.atomic_path` does, is safe); `verify_weights` checks at the
    end of the session that no test wrote through."""
    def copy(src: str, dst: str) -> None:
        if share_weights and src.endswith(".pt") and os.path.islink(src):
            os.link(os.path.realpath(src), dst)
        else:
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, symlinks=False, ignore=_outside_the_workspace, copy_function=copy)
    (dest / ".venv").symlink_to(os.readlink(source / ".venv"))
    if (source / ".dvc" / "cache").is_dir():
        shutil.copytree(source / ".dvc" / "cache", dest / ".dvc" / "cache", copy_function=os.link)
    return dest


def verify_weights(source: Path) -> None:
    """The weights in the source's DVC cache still have the content they are named by (DVC names an
    object by its md5): no copy made with `share_weights` wrote through its links."""
    import hashlib
    changed = []
    for path in (source / ".dvc" / "cache" / "files" / "md5").glob("*/*"):
        if path.stat().st_size > 1 << 20:
            digest = hashlib.md5()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            if digest.hexdigest() != path.parent.name + path.name:
                changed.append(path)
    assert not changed, ("a test wrote into weights it shared with the micro project "
                         f"(copy_project(share_weights=True)): {changed}")
