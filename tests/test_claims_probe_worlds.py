"""The worlds that rules on gradient probes and caption statistics deny (hnclip.claims.probe_worlds): a
probe statistic moved onto its claim's boundary and block-bootstrapped by run and epoch, a caption
statistic judged as an exact check against the paper's value; and the gate lets these claims be supported
where the evidence clears them, contradicted where it fails."""
import math

import numpy as np
import pytest

from hnclip.claims import probe_worlds as P
from hnclip.claims.calibration import QueryPool, probe_records
from hnclip.claims.definitions import NULL_SUPPORT_MAX, claim_definitions, rule_specificity
from hnclip.claims.evidence import paper_geometry
from hnclip.claims.tie import paper_test_sizes
from hnclip.claims.verdicts import decide, with_specificity
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings

CLAIMS = {c["claim_id"]: c for c in claim_definitions()}
PROBES_AND_CAPTIONS = [cid for cid, c in CLAIMS.items() if P.reads_probes_or_captions(c)]


def _records(figure: str, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [r for run in P.FIGURE_RUNS[figure] for r in probe_records(run, rng)]


def test_fifteen_claims_read_probes_or_caption_statistics_and_each_has_its_null_measured():
    assert len(PROBES_AND_CAPTIONS) == 15
    measured = rule_specificity()
    for cid in PROBES_AND_CAPTIONS:
        entry = measured[cid]
        assert entry["null_support"] is not None and entry["specificity_note"] == "", cid
        assert entry["null_worlds"] >= 1


def test_a_share_sits_just_on_the_false_side_of_its_boundary():
    claim = CLAIMS["saturation_epoch1"]  # >= 0.35 of epoch 1's probes below 1e-3
    records = _records("fig4_gradient_dynamics")
    (boundary,) = P.probe_targets(claim, "null")
    world = P.boundary_records(claim, records, boundary, np.random.default_rng(0))
    first = [r for r in world if r["epoch"] == 1]
    share = np.mean([r["clip_loss"] < 1e-3 for r in first])
    assert share == (math.ceil(0.35 * len(first)) - 1) / len(first) < 0.35
    # the other epochs are the truth's own
    assert [r["clip_loss"] for r in world if r["epoch"] > 1] == [r["clip_loss"] for r in records if r["epoch"] > 1]


def test_a_minimum_over_runs_moves_only_its_smallest_run():
    claim = CLAIMS["gradient_ratio_peaks"]  # every run's peak log10 ratio >= 3 on real data
    records = _records("figA8_gradient_dynamics_scales")
    (boundary,) = P.probe_targets(claim, "null")
    world = P.boundary_records(claim, records, boundary, np.random.default_rng(0))
    spec = claim["statistic"]["probe"]
    peaks = {run: P._item_value(spec, world, [i for i, r in enumerate(world) if r["run"] == run])
             for run in P.FIGURE_RUNS[spec["figure"]]}
    before = {run: P._item_value(spec, records, [i for i, r in enumerate(records) if r["run"] == run])
              for run in peaks}
    lowest = min(before, key=before.get)
    assert peaks[lowest] == pytest.approx(3.0, abs=1e-6) and peaks[lowest] < 3.0
    assert all(peaks[run] == pytest.approx(before[run]) for run in peaks if run != lowest)


def test_a_first_crossing_is_put_on_its_step_and_the_blocks_split_there():
    claim = CLAIMS["clip_loss_collapses_early"]  # first probe below 1e-5 before step 100
    (boundary,) = P.probe_targets(claim, "null")
    world = P.boundary_records(claim, _records("fig4_gradient_dynamics"), boundary, np.random.default_rng(0))
    below = sorted(r["step"] for r in world if r["clip_loss"] < 1e-5)
    assert below[0] == 100
    for seed in range(5):
        drawn = P.block_bootstrap(world, np.random.default_rng(seed), split_step=100)
        assert min(r["step"] for r in drawn if r["clip_loss"] < 1e-5) >= 100
        # the slots keep their steps and epochs; values come from the same block
        assert sorted(r["step"] for r in drawn) == sorted(r["step"] for r in world)
        assert all(r["epoch"] == next(w["epoch"] for w in world if w["step"] == r["step"]) for r in drawn)


def test_an_exact_check_passes_the_papers_value_and_fails_one_benchmark_just_outside_its_tolerance():
    pool = QueryPool(Bootstrap(BootstrapSettings(resamples=10, seed=0)), np.random.default_rng(0),
                     paper_test_sizes())
    claim = CLAIMS["hardest_negative_similarity"]  # each benchmark within 0.015 of Table A1
    worlds = P.exact_worlds(claim, "null")
    assert len(worlds) == 6  # three benchmarks, each above and below
    docci = paper_geometry("docci", "mean_hardest_negative_cosine")
    assert sorted(w["docci"] - docci for w in worlds if w["docci"] != docci) == pytest.approx([-0.02, 0.02])
    assert P.exact_support(claim, pool, np.random.default_rng(0), "null") == 0.0
    truth = {b: paper_geometry(b, "mean_hardest_negative_cosine") for b in ("docci", "dci", "urban1k")}
    from hnclip.claims.preconditions import paper_conditions
    from hnclip.claims.verdicts import judge_claim
    row = judge_claim(claim, P.ExactSource(pool, np.random.default_rng(0), truth), paper_conditions(), pool.boot)
    assert row["verdict"] == "supported"
    assert isinstance(P.exact_worlds({**claim, "exact_check": None}, "null"), str)


def test_the_probe_nulls_hold_on_another_simulation_seed():
    """The file's null shares (seed 0, 200 reproductions) on seed 1 with 40: the probe rules stay below the
    gate's limit where the file says so (a share of 40 draws near 0.10 moves by about 0.05)."""
    pool = QueryPool(Bootstrap(BootstrapSettings(resamples=100, seed=1)), np.random.default_rng(1),
                     paper_test_sizes())
    measured = rule_specificity()
    for cid in ("saturation_epoch1", "exact_zero_gradient", "hn_gradient_dominates", "gradient_cosine_median"):
        support = P.probe_support(CLAIMS[cid], pool, np.random.default_rng(1), "null", 40)
        assert support <= NULL_SUPPORT_MAX + 0.1, cid
        assert abs(support - measured[cid]["null_support"]) <= 0.15, cid


@pytest.mark.parametrize("claim_id", ["hardest_negative_similarity", "in_batch_negatives_similar",
                                      "exact_zero_gradient", "hn_keeps_batches_active", "clip_loss_collapses_early"])
def test_these_claims_reach_supported_where_the_evidence_clears_them_and_contradicted_where_it_fails(claim_id):
    claim, measured = CLAIMS[claim_id], rule_specificity()
    decision = claim.get("real_data_decision", claim["decision"])
    for value, verdict in ((_clearing(decision), "supported"), (_failing(decision), "contradicted")):
        judged = decide(decision, value, value, value)
        row = with_specificity({"verdict": judged, "paper_verdict": judged, "reason": ""}, claim, measured)
        assert (judged, row["verdict"]) == (verdict, verdict), (claim_id, value)


def _clearing(decision: dict) -> float:
    if decision["op"] == "between":
        return (decision["low"] + decision["high"]) / 2
    return decision["threshold"] + (1 if decision["op"] in (">", ">=") else -1) * 0.01 * max(1, decision["threshold"])


def _failing(decision: dict) -> float:
    if decision["op"] == "between":
        return decision["high"] + 0.1
    return decision["threshold"] - (1 if decision["op"] in (">", ">=") else -1) * 0.1 * max(1, decision["threshold"])
