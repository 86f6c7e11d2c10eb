"""The timing claims' controlled measurement: runs' optimizer steps taken in turn on the same batches
(hnclip.training.step_timing), and the scorecard's `paired_timing` statistic with an interval over the
rounds (hnclip.claims.statistics)."""
from __future__ import annotations

import numpy as np
import pytest
from helpers.training import EVALUATION, EXECUTION, SPEC

from hnclip.claims.statistics import statistic_draws
from hnclip.claims.verdicts import decide
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings
from hnclip.training.loop import TrainJob
from hnclip.training.step_timing import paired_step_times


def make_job(tiny_data, out, name, gamma):
    spec = {**SPEC, "objective": {**SPEC["objective"], "gamma": gamma}}
    return TrainJob(run_id=name, spec=spec, spec_hash=name[0] * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / name,
                    checkpoint_dir=out / f"{name}-ckpt",
                    execution={**EXECUTION, "grad_probe_every": 1}, evaluation=EVALUATION)


def test_runs_take_their_steps_in_turn_on_the_same_batches(tiny_data, tmp_path):
    jobs = {"plain": make_job(tiny_data, tmp_path, "plain", 0.0), "hn": make_job(tiny_data, tmp_path, "hn", 0.5)}
    measured = paired_step_times(jobs, rounds=4, warmup=2)
    assert measured["rounds"] == 4 and measured["warmup"] == 2
    assert {k: len(v) for k, v in measured["seconds"].items()} == {"plain": 4, "hn": 4}
    assert all(s > 0 for v in measured["seconds"].values() for s in v)
    # the order rotates each round, so neither run is always first; the warmup's groups are the ones timed
    assert measured["orders"] == [["plain", "hn"], ["hn", "plain"], ["plain", "hn"], ["hn", "plain"]]
    assert measured["groups"] == [0, 1, 0, 1]
    # nothing of the runs is written: no checkpoint, no probe log (the probe is off while timing)
    assert not any((tmp_path / name).exists() for name in ("plain", "hn", "plain-ckpt", "hn-ckpt"))


def test_runs_on_different_batches_cannot_be_paired(tiny_data, tmp_path):
    other = make_job(tiny_data, tmp_path, "other", 0.0)
    other.spec = {**other.spec, "seed": other.spec["seed"] + 1}
    with pytest.raises(ValueError, match="same micro-batches"):
        paired_step_times({"plain": make_job(tiny_data, tmp_path, "plain", 0.0), "other": other}, rounds=2, warmup=1)


class _Timings:
    """A source of paired step seconds (the ReproducedSource interface's part the statistic reads)."""

    def __init__(self, seconds: dict[str, list[float]], boot: Bootstrap):
        self.seconds, self.boot, self.evidence = seconds, boot, []

    def step_times(self, table, row):
        return np.asarray(self.seconds[row], dtype=float)

    def resample(self, unit, values, statistic):
        index = self.boot.resample(unit, len(values))
        return np.concatenate([[statistic(values[None, :])[0]], statistic(values[index])])


STATISTIC = {"paired_timing": {"table": "tableA3", "numerator": "hn_clip", "denominator": "longclip_ft"}}
DECISION = {"op": "<=", "threshold": 1.25}


def _verdict(hn: list[float], plain: list[float]) -> tuple[str, float]:
    boot = Bootstrap(BootstrapSettings(resamples=500, seed=0))
    draws = statistic_draws(STATISTIC, _Timings({"hn_clip": hn, "longclip_ft": plain}, boot))
    low, high = boot.interval(draws[1:])
    return decide(DECISION, draws[0], low, high), draws[0]


def test_the_ratio_is_paired_round_by_round():
    # every round's load moves both runs alike: the ratio is exactly 1.1 whatever the load
    load = [1.0, 3.0, 0.5, 2.0, 1.0, 4.0, 0.7, 1.5]
    verdict, ratio = _verdict([1.1 * x for x in load], load)
    assert ratio == pytest.approx(1.1) and verdict == "supported"


def test_an_interval_straddling_the_threshold_is_inconclusive():
    plain = [1.0] * 12
    verdict, ratio = _verdict([1.1, 1.4] * 6, plain)
    assert verdict == "inconclusive" and 1.1 <= ratio <= 1.4
    assert _verdict([1.4, 1.5] * 6, plain)[0] == "contradicted"


def test_the_plan_times_the_rows_params_yaml_names(params):
    import copy

    from hnclip.config.registry import Registry
    from hnclip.errors import UnknownNameError
    plan = Registry(params).paired_timing()
    assert list(plan["runs"]) == ["longclip_ft", "hn_clip", "goal", "structxlip"]
    assert (plan["table"], plan["rounds"], plan["warmup"]) == ("tableA3", 10, 2)
    bad = copy.deepcopy(params)
    bad["derived_tables"]["tableA3"]["paired_timing"]["rows"] = ["hn_clip", "hnclip"]
    with pytest.raises(UnknownNameError, match=r"paired_timing\.rows: unknown row\(s\) \['hnclip'\]"):
        Registry(bad).paired_timing()
