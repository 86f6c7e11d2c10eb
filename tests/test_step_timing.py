"""The timing claims' controlled measurement: runs' optimizer steps taken on the same distinct batches, in a
random order (hnclip.training.step_timing), and the scorecard's `paired_timing` statistic, the median of the
rounds' ratios with its order-statistic interval (hnclip.claims.statistics)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.training import EVALUATION, EXECUTION, SPEC

from hnclip.claims.statistics import statistic_draws
from hnclip.claims.verdicts import decide
from hnclip.config.params import load_params
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings
from hnclip.training.loop import TrainJob
from hnclip.training.step_timing import paired_step_times, timed_groups


def make_job(tiny_data, out, name, gamma):
    spec = {**SPEC, "objective": {**SPEC["objective"], "gamma": gamma}}
    return TrainJob(run_id=name, spec=spec, spec_hash=name[0] * 64, init_kind="scratch", init_path=None,
                    model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                    eval_manifests={"docci": tiny_data["test"]}, out_dir=out / name,
                    checkpoint_dir=out / f"{name}-ckpt",
                    execution={**EXECUTION, "grad_probe_every": 1}, evaluation=EVALUATION)


def test_runs_take_their_steps_on_the_same_distinct_batches_in_a_random_order(tiny_data, tmp_path):
    jobs = {"plain": make_job(tiny_data, tmp_path, "plain", 0.0), "hn": make_job(tiny_data, tmp_path, "hn", 0.5)}
    measured = paired_step_times(jobs, rounds=4, warmup=1, seed=3)
    assert measured["rounds"] == 4 and measured["warmup"] == 1 and measured["alone"] is False  # a CPU: in turn
    assert {k: len(v) for k, v in measured["seconds"].items()} == {"plain": 4, "hn": 4}
    assert all(s > 0 for v in measured["seconds"].values() for s in v)
    # each round's order is drawn: both orders occur, so neither run is always first
    assert all(sorted(order) == ["hn", "plain"] for order in measured["orders"])
    assert {tuple(order) for order in measured["orders"]} == {("plain", "hn"), ("hn", "plain")}
    # four distinct (epoch, group) pairs, from more than one epoch (the tiny set has few groups an epoch)
    assert len({tuple(g) for g in measured["groups"]}) == 4 and len({e for e, _ in measured["groups"]}) > 1
    # each run timed at its own compute batch, recorded
    assert measured["compute_batch"] == {"plain": SPEC["recipe"]["micro_batch"], "hn": SPEC["recipe"]["micro_batch"]}
    # nothing of the runs is written: no checkpoint, no probe log (the probe is off while timing)
    assert not any((tmp_path / name).exists() for name in ("plain", "hn", "plain-ckpt", "hn-ckpt"))


def test_runs_timed_alone_are_each_loaded_timed_and_freed_in_turn(tiny_data, tmp_path):
    jobs = {"plain": make_job(tiny_data, tmp_path, "plain", 0.0), "hn": make_job(tiny_data, tmp_path, "hn", 0.5)}
    measured = paired_step_times(jobs, rounds=2, warmup=1, seed=0, alone=True)
    assert measured["alone"] is True and {k: len(v) for k, v in measured["seconds"].items()} == {"plain": 2, "hn": 2}


def test_timed_groups_are_distinct_and_seeded():
    warm, timed = timed_groups(per_epoch=4, rounds=20, warmup=2, seed=0)
    assert len(set(timed)) == 20 and not set(warm) & set(timed)
    assert {epoch for epoch, _ in timed} <= set(range(6)) and all(0 <= g < 4 for _, g in timed)
    assert timed_groups(4, 20, 2, seed=0) == (warm, timed) and timed_groups(4, 20, 2, seed=1)[1] != timed
    assert timed != sorted(timed)  # a random order, not the epochs' own


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


STATISTIC = {"paired_timing": {"table": "tableA3", "numerator": "hn_clip", "denominator": "longclip_ft"}}
DECISION = {"op": "<=", "threshold": 1.25}
BOOT = Bootstrap(BootstrapSettings(resamples=500, seed=0))


def _draws(hn: list[float], plain: list[float]) -> np.ndarray:
    return statistic_draws(STATISTIC, _Timings({"hn_clip": hn, "longclip_ft": plain}, BOOT))


def _verdict(hn: list[float], plain: list[float]) -> tuple[str, float]:
    draws = _draws(hn, plain)
    low, high = BOOT.interval(draws[1:])
    return decide(DECISION, draws[0], low, high), draws[0]


def test_the_ratio_is_paired_round_by_round():
    # every round's load moves both runs alike: the ratio is exactly 1.1 whatever the load
    load = [1.0, 3.0, 0.5, 2.0, 1.0, 4.0, 0.7, 1.5]
    verdict, ratio = _verdict([1.1 * x for x in load], load)
    assert ratio == pytest.approx(1.1) and verdict == "supported"


def test_the_median_of_varying_per_round_ratios_and_its_order_statistic_interval():
    """The median is taken over the rounds' ratios (not over the runs, nor of the seconds before dividing),
    and its interval is the distribution-free one: the 6th and 15th of 20 sorted ratios."""
    rng = np.random.default_rng(0)
    ratios = np.round(1.0 + 0.3 * rng.random(20), 3)  # every round its own ratio
    load = np.exp(rng.normal(0, 0.5, 20))              # and its own load, shared by both runs
    draws = _draws(list(ratios * load), list(load))
    ordered = np.sort(ratios)
    assert draws[0] == pytest.approx(np.median(ratios))
    assert draws[0] != pytest.approx(np.median(ratios * load) / np.median(load))
    assert BOOT.interval(draws[1:]) == (pytest.approx(ordered[5]), pytest.approx(ordered[14]))
    # ten rounds: the 2nd and 9th
    assert BOOT.interval(_draws(list(ratios[:10]), [1.0] * 10)[1:]) == (
        pytest.approx(np.sort(ratios[:10])[1]), pytest.approx(np.sort(ratios[:10])[8]))


def test_an_interval_straddling_the_threshold_is_inconclusive():
    plain = [1.0] * 20
    verdict, ratio = _verdict([1.1, 1.4] * 10, plain)
    assert verdict == "inconclusive" and 1.1 <= ratio <= 1.4
    assert _verdict([1.4, 1.5] * 10, plain)[0] == "contradicted"


def test_the_plan_times_the_rows_params_yaml_names(params):
    import copy

    from hnclip.config.registry import Registry
    from hnclip.errors import UnknownNameError
    plan = Registry(params).paired_timing()
    assert list(plan["runs"]) == ["longclip_ft", "hn_clip", "goal", "structxlip"]
    assert (plan["table"], plan["rounds"], plan["warmup"]) == ("tableA3", 20, 2)
    # a profile's timing_rounds replaces the table's counts, for that profile only
    params_file = Path(__file__).resolve().parents[1] / "params.yaml"
    rehearsal = Registry(load_params(params_file, {"profile": "paper_rehearsal"}), validate=False).paired_timing()
    assert (rehearsal["rounds"], rehearsal["warmup"]) == (3, 1) and list(rehearsal["runs"]) == list(plan["runs"])
    bad = copy.deepcopy(params)
    bad["derived_tables"]["tableA3"]["paired_timing"]["rows"] = ["hn_clip", "hnclip"]
    with pytest.raises(UnknownNameError, match=r"paired_timing\.rows: unknown row\(s\) \['hnclip'\]"):
        Registry(bad).paired_timing()
