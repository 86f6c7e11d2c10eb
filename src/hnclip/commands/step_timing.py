"""`hnclip step-timing`: the timing claims' controlled measurement. The timing table's runs (Table A3's
rows, params.yaml `derived_tables.<timing table>.paired_timing`) take optimizer steps on the same distinct
accumulation groups in a random order, each at its own compute batch (alone on a GPU; in turn on a CPU:
hnclip.training.step_timing), and results/stats/step_timing.json records every round's seconds, the
groups, the orders and each run's compute batch, with provenance. The claims scorecard judges
`paired_timing` statistics from it (an interval over the rounds); Table A3 keeps each run's own wall
clock."""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.errors import UserError
from hnclip.io import write_json


def step_timing_inputs(reg: Registry) -> list[Path]:
    """What the measurement reads: the initial weights, the training set and the runs' auxiliary inputs
    (no torch import: the Snakefile asks)."""
    plan = reg.paired_timing()
    if plan is None:
        return []
    backbone = reg.backbone_spec()
    files = [paths.backbone_weights(reg.backbone_name(), backbone["kind"], reg.profile["data_root"])]
    for run in plan["runs"].values():
        files += [reg.train_manifest(reg.run(run).train_set), *reg.auxiliary_inputs(run).values()]
    return [Path(f) for f in dict.fromkeys(str(f) for f in files)]


def build_step_timing(reg: Registry) -> list[Path]:
    """results/stats/step_timing.json: each row's optimizer-step seconds per round, with provenance."""
    from hnclip.training.jobs import finetune_job
    from hnclip.training.step_timing import paired_step_times
    plan = reg.paired_timing()
    if plan is None:
        raise UserError("this profile plans no paired timing (a timing table with `paired_timing` and at least "
                        "two implemented rows)")
    started = time.time()
    missing = [str(p) for p in step_timing_inputs(reg) if not Path(p).is_file()]
    if missing:
        raise UserError(f"the timed runs' inputs are missing: {missing}; build them first (snakemake {missing[0]})")
    jobs = {row: finetune_job(reg, run) for row, run in plan["runs"].items()}
    measured = paired_step_times(jobs, plan["rounds"], plan["warmup"])
    out = paths.step_timing()
    record = {"table": plan["table"], "runs": plan["runs"], **measured,
              "provenance": provenance.record(
                  "stats", inputs={f"input:{p}": p for p in step_timing_inputs(reg)},
                  params={"paired_timing": {"rounds": plan["rounds"], "warmup": plan["warmup"]},
                          "specs": {row: reg.run(run).spec for row, run in plan["runs"].items()}},
                  wall_time_s=time.time() - started)}
    write_json(out, record)
    return [out]
