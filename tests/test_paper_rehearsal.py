"""The paper profile's rehearsal: `scripts/paper_rehearsal.sh` on a fresh copy of the project runs the
paper profile's whole workflow (profile `paper_rehearsal`) on the loopback mirror of miniatures, once
per module. Then: every table and figure the paper profile writes is there, the workflow has nothing
left to do, a Table 1 GOAL cell's lineage reaches the mirrored files, the audit is clean and catches a
tampered mirrored file. The unit tests around it need no rehearsal run: the miniatures match their
pins, the rehearsal's table never leaks into the paper profile, and the paper profile refuses a
miniature."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest
from helpers.fault_server import FAST

from hnclip.config import paths
from hnclip.config.params import load_params
from hnclip.config.registry import Registry
from hnclip.data.download import download_dataset
from hnclip.data.download_errors import ChecksumMismatch, DownloadError
from hnclip.data.rehearsal_sources import REHEARSAL_PINS, rehearsal_sources
from hnclip.data.source_tables import profile_source
from hnclip.data.sources import SOURCES
from hnclip.provenance.lineage import iter_nodes, lineage
from hnclip.rehearsal.server import serving

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
PROJECT_FILES = ("Snakefile", "params.yaml", ".gitignore")
REHEARSAL_TIMEOUT_S = 1800  # the budget is 8 minutes on two quiet cores; a loaded CI machine gets slack


def registry(profile: str) -> Registry:
    return Registry(load_params(ROOT / "params.yaml", {"profile": profile}), validate=False)


def pin(source: str, name: str) -> str:
    return REHEARSAL_PINS[source][name][0]


# ---- the rehearsal, run once -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> Iterator[Path]:
    """A fresh copy of the project (tracked layout: Snakefile, params.yaml, workflow/, scripts/, .venv
    linked) in which the one README command ran to the end. Removed afterwards: it holds about 5 GB
    (each run's weights and resume checkpoint carry CLIP's 49,408-token embedding)."""
    proj = tmp_path_factory.mktemp("rehearsal")
    for name in PROJECT_FILES:
        shutil.copy(ROOT / name, proj / name)
    shutil.copytree(ROOT / "workflow", proj / "workflow")
    shutil.copytree(ROOT / "scripts", proj / "scripts")
    (proj / ".venv").symlink_to(VENV_BIN.parent)
    proc = subprocess.run(["scripts/paper_rehearsal.sh"], cwd=proj, capture_output=True, text=True,
                          timeout=REHEARSAL_TIMEOUT_S, env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"})
    assert proc.returncode == 0, f"the rehearsal failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert "mirror stopped" in proc.stdout
    yield proj
    shutil.rmtree(proj, ignore_errors=True)


def paper_outputs(reg: Registry) -> list[str]:
    """Every table, figure, effects table, scorecard, regime report and metric file the paper profile
    writes (what its `rule all` asks for, besides data records)."""
    params = reg.params
    out = [str(paths.table(t, ext)) for t in reg.tables for ext in ("md", "tex", "csv", "provenance.json")]
    out += [f"results/effects/{t}.{ext}" for t in reg.tables for ext in ("csv", "md")]
    out += [str(paths.figure(f, ext)) for f in params["figures"] for ext in ("png", "pdf")]
    out += [str(paths.stats(b)) for b in params["benchmarks"]]
    out += [str(paths.table(reg.derived_table("caption_geometry"), ext)) for ext in ("md", "tex", "csv")]
    out += [str(paths.table(reg.derived_table("timing"), ext)) for ext in ("md", "csv")]
    out += ["results/claims.csv", "results/claims.md", str(paths.regime_report("json")), str(paths.regime_report("md")),
            "results/metrics.json", "results/plots/convergence.csv", str(paths.overlap_report("vg", "urban1k"))]
    return out


def test_the_rehearsal_profile_is_the_paper_profile_but_for_sizes():
    paper, rehearsal_reg = registry("paper"), registry("paper_rehearsal")
    assert len(rehearsal_reg.runs()) == len(paper.runs())
    assert list(rehearsal_reg.tables) == list(paper.tables)
    assert rehearsal_reg.summary()["cells"] == paper.summary()["cells"]
    p, r = paper.profile, rehearsal_reg.profile
    assert r["datasets"] == p["datasets"] and r["auxiliary"] == p["auxiliary"] and r["seeds"] == p["seeds"]
    same_recipe = {k: v for k, v in p["recipe"].items() if k not in ("epochs", "micro_batch", "precision")}
    assert {k: r["recipe"][k] for k in same_recipe} == same_recipe
    assert paper.backbone_spec()["kind"] == rehearsal_reg.backbone_spec()["kind"] == "longclip"
    assert paper.backbone_spec()["source"] == rehearsal_reg.backbone_spec()["source"]
    assert "source_table" not in p and r["source_table"] == "rehearsal"


def test_rehearsal_writes_every_table_and_figure_of_the_paper_profile(rehearsal):
    expected = paper_outputs(registry("paper"))
    missing = [path for path in expected if not (rehearsal / path).is_file() or not (rehearsal / path).stat().st_size]
    assert not missing, f"the rehearsal did not write {missing}"
    assert len(list((rehearsal / "results" / "runs").iterdir())) == len(registry("paper_rehearsal").runs())
    # every framework of the paper trains and is evaluated through the workflow's rules: each Table 1 row
    # has a number in every cell
    table1 = pd.read_csv(rehearsal / "results/tables/table1.csv")
    assert set(table1["row"]) == {row["key"] for row in registry("paper").params["tables"]["table1"]["rows"]}
    assert {"finelip", "goal", "structxlip", "hn_clip"} <= set(table1["row"])
    assert (table1["status"] == "ok").all() and table1["ours_mean"].notna().all()


def test_the_workflow_has_nothing_left_to_do(rehearsal):
    proc = subprocess.run([str(VENV_BIN / "snakemake"), "-n", "--workflow-profile", "workflow/profiles/default",
                           "--config", "profile=paper_rehearsal"], cwd=rehearsal, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr


GOAL_CELL = "goal/dci/t2i/R@1"


def test_lineage_of_a_table1_goal_cell_reaches_the_mirrored_files(rehearsal):
    chain = lineage(rehearsal / "results/tables/table1.csv", GOAL_CELL, root=rehearsal)
    nodes = list(iter_nodes(chain))
    hashes = {node.get("sha256") for node in nodes} | {
        value for node in nodes for value in _strings(node.get("facts"))}
    for source, name in (("dci", "dci.tar.gz"), ("sam_vit_huge", "model.safetensors"),
                         ("clip_vit_l14_336", "pytorch_model.bin"), ("longclip_l", "longclip-L.pt")):
        assert pin(source, name) in hashes, f"the lineage of {GOAL_CELL} does not reach {source}/{name}"
    assert not [node for node in nodes if node.get("verified") in (False, "missing")]


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def hnclip(proj: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hnclip", "--profile", "paper_rehearsal", *argv], cwd=proj,
                          capture_output=True, text=True)


def test_audit_is_clean(rehearsal):
    proc = hnclip(rehearsal, "audit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "audit ok" in proc.stdout


def test_audit_catches_a_tampered_mirrored_file(rehearsal):
    archive = rehearsal / "data/rehearsal/dci/raw/dci.tar.gz"
    original, stat = archive.read_bytes(), archive.stat()
    try:
        archive.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
        proc = hnclip(rehearsal, "audit")
        assert proc.returncode == 1
        assert "data/rehearsal/dci/raw/dci.tar.gz" in proc.stderr
    finally:
        archive.write_bytes(original)
        os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert hnclip(rehearsal, "audit").returncode == 0


# ---- without a rehearsal run -------------------------------------------------------------------------
def test_the_miniatures_are_the_pinned_files():
    """Byte-identical from one build to the next, and what the rehearsal's table pins; a failure here
    means a builder, the synthetic generator or a library writing the files changed: rerun
    `python -m hnclip.rehearsal pins` and update hnclip/data/rehearsal_sources.py."""
    from hnclip.rehearsal.mirror import miniatures
    built = {source: {name: (hashlib.sha256(data).hexdigest(), len(data)) for name, data in files.items()}
             for source, files in miniatures().items()}
    assert built == REHEARSAL_PINS


def test_the_rehearsal_table_covers_the_public_one_and_leaves_it_alone():
    table = rehearsal_sources()
    assert set(table) == set(SOURCES)
    for name, source in SOURCES.items():
        assert [f.name for f in table[name].files] == [f.name for f in source.files]
        for public, miniature in zip(source.files, table[name].files):
            assert miniature.checksum == pin(name, public.name) != public.checksum
            assert miniature.url is None and miniature.hub_repo is None  # only a mirror serves them
            assert (miniature.manual, miniature.extract_to, miniature.extract_only, miniature.flatten) == \
                (public.manual, public.extract_to, public.extract_only, public.flatten)
    assert profile_source(registry("paper").profile, "dci") is SOURCES["dci"]
    assert profile_source(registry("paper_rehearsal").profile, "dci") is table["dci"]


def test_the_paper_profile_refuses_a_miniature(tmp_path):
    """The real pins are never bypassed: a mirror serving the rehearsal's files to the paper profile
    fails the checksum, and the Long-CLIP loader refuses the rehearsal's checkpoint."""
    from hnclip.models.factory import backbone_pin, load_backbone
    from hnclip.models.longclip import ChecksumMismatchError
    from hnclip.rehearsal.mirror import dci_files, longclip_files
    mirror = tmp_path / "mirror"
    for name, data in dci_files().items():
        (mirror / "dci").mkdir(parents=True, exist_ok=True)
        (mirror / "dci" / name).write_bytes(data)
    paper = registry("paper").profile
    with serving(mirror) as url:
        with pytest.raises(ChecksumMismatch, match="dci.tar.gz"):
            download_dataset("dci", tmp_path / "data", url, source=profile_source(paper, "dci"), **FAST)
        assert not (tmp_path / "data/dci/raw/dci.tar.gz").exists()  # a refused body is never kept
    checkpoint = tmp_path / "longclip-L.pt"
    checkpoint.write_bytes(longclip_files()["longclip-L.pt"])
    spec = registry("paper").backbone_spec()
    with pytest.raises(ChecksumMismatchError):
        load_backbone(spec["kind"], checkpoint, spec["model_config"], backbone_pin(paper, spec))
    rehearsal_reg = registry("paper_rehearsal")
    loaded = load_backbone("longclip", checkpoint, "longclip-rehearsal",
                           backbone_pin(rehearsal_reg.profile, rehearsal_reg.backbone_spec()))
    assert loaded.model.context_length == 248


def test_a_rehearsal_file_without_a_mirror_says_to_set_one(tmp_path, monkeypatch):
    monkeypatch.delenv("HNCLIP_MIRROR", raising=False)
    with pytest.raises(DownloadError, match="HNCLIP_MIRROR"):
        download_dataset("urban1k", tmp_path, source=rehearsal_sources()["urban1k"], **FAST)


def test_a_changed_pin_reruns_the_download(monkeypatch):
    """The download rules take the source's pins as params: a new pin (a re-released file) makes
    Snakemake fetch and verify again, where the old file would otherwise stay and be refused at load."""
    from dataclasses import replace

    from hnclip.data import source_tables
    paper = registry("paper").profile
    before = source_tables.pins(paper, "longclip_l")
    assert before == {"longclip-L.pt": ["sha256", SOURCES["longclip_l"].file("longclip-L.pt").checksum]}
    new = replace(SOURCES["longclip_l"], files=(replace(SOURCES["longclip_l"].files[0], checksum="0" * 64),))
    monkeypatch.setitem(SOURCES, "longclip_l", new)
    assert source_tables.pins(paper, "longclip_l") != before
    rules = {name: (ROOT / "workflow/rules" / name).read_text() for name in ("data.smk", "backbone.smk")}
    assert "pins=lambda w: source_pins(w.source)" in rules["data.smk"]
    assert 'pins=source_pins("longclip_l")' in rules["backbone.smk"]
