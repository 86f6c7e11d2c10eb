"""The rehearsal in one command: build the mirror, place DCI's SA-1B shard by hand, serve the mirror on
loopback, run the paper profile's whole workflow at miniature size, stop the mirror.

    python -m hnclip.rehearsal                 # from the project root (or scripts/paper_rehearsal.sh)

What runs is exactly `snakemake --workflow-profile workflow/profiles/default --config
profile=paper_rehearsal` with HNCLIP_MIRROR pointing at the mirror: the downloads, the real-data
builders, the auxiliary models, the 69 runs, every table, figure, effects table, scorecard and metric.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hnclip.data.sources import MIRROR_ENV

PROFILE = "paper_rehearsal"
MIRROR_DIR = Path("data/rehearsal_mirror")   # under data/ (not tracked), next to the profile's data root


@dataclass
class RehearsalResult:
    returncode: int
    wall_time_s: float
    mirror_url: str


def data_root(project: Path) -> Path:
    from hnclip.config.params import load_params
    params = load_params(project / "params.yaml", {"profile": PROFILE})
    return project / params["profiles"][PROFILE]["data_root"]


def place_by_hand(mirror_dir: Path, root: Path) -> list[Path]:
    """Put the mirror's hand-placed files where the README tells a user to put them
    (`<data root>/<source>/raw/<name>`), as a user would: a plain copy, no download. A copy left by an
    earlier rehearsal is replaced when the miniature changed (the download then verifies it afresh)."""
    from hnclip.rehearsal.mirror import BY_HAND
    placed = []
    for path in sorted((mirror_dir / BY_HAND).glob("*/*")):
        target = root / path.parent.name / "raw" / path.name
        if not target.exists() or target.read_bytes() != path.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        placed.append(target)
    return placed


def snakemake_command(cores: int, extra: list[str] = ()) -> list[str]:
    snakemake = Path(sys.executable).parent / "snakemake"
    return [str(snakemake), "--workflow-profile", "workflow/profiles/default", "--config", f"profile={PROFILE}",
            "--cores", str(cores), *extra]


def run_rehearsal(project: str | Path = ".", cores: int = 2, extra: list[str] = (), log=print) -> RehearsalResult:
    """Run the rehearsal in `project` (a checkout of this repository); returns Snakemake's exit status."""
    from hnclip.rehearsal.mirror import build_mirror
    from hnclip.rehearsal.server import serving

    project = Path(project).resolve()
    started = time.time()
    mirror_dir = project / MIRROR_DIR
    log(f"rehearsal: building the mirror's miniatures in {mirror_dir}")
    build_mirror(mirror_dir)
    for path in place_by_hand(mirror_dir, data_root(project)):
        log(f"rehearsal: placed {path.relative_to(project)} by hand")
    with serving(mirror_dir) as url:
        log(f"rehearsal: serving the mirror at {url}")
        env = {**os.environ, MIRROR_ENV: url}
        command = snakemake_command(cores, list(extra))
        log("rehearsal: " + " ".join(command))
        returncode = subprocess.run(command, cwd=project, env=env).returncode
    wall = time.time() - started
    log(f"rehearsal: mirror stopped; snakemake exited {returncode} after {wall / 60:.1f} min in all")
    return RehearsalResult(returncode, wall, url)
