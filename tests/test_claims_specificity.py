"""Specificity of the claims' rules (hnclip.claims.specificity) and the scorecard's gate on "supported"
(hnclip.claims.verdicts.with_specificity): a rule that also passes when the claimed effect is
absent reports "consistent", never "supported"."""
import math

import numpy as np
import pytest

from hnclip.claims import correlation as C
from hnclip.claims import specificity as S
from hnclip.claims import worlds as W
from hnclip.claims.calibration import QueryPool, printed
from hnclip.claims.definitions import (
    NULL_SUPPORT_MAX,
    SIZE_MIN,
    SPECIFICITY_FILE,
    claim_definitions,
    rule_hash,
    rule_specificity,
)
from hnclip.claims.tie import paper_model, paper_test_sizes, resolved, with_tie
from hnclip.claims.verdicts import is_borderline, with_specificity
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings
from hnclip.io import read_json, write_json

SIMS = 100
CLAIMS = {c["claim_id"]: c for c in claim_definitions()}
DOCCI_T2I = ("docci", "t2i", "R@1")


CORRELATION = read_json(SPECIFICITY_FILE)["settings"]["correlation"]


def _gated_supported() -> set[str]:
    measured, row = rule_specificity(), {"verdict": "supported", "paper_verdict": "supported", "reason": ""}
    return {cid for cid, claim in CLAIMS.items() if with_specificity(row, claim, measured)["verdict"] == "supported"}


@pytest.fixture(scope="module")
def worlds():
    """The world each rule is meant to deny (its null), for every claim the gate lets be supported and those
    the checks below read, 100 reproductions each, on another simulation seed than the file's, at the
    between-run correlation the file was measured with (the file holds every claim's, on seed 0)."""
    read = _gated_supported() | set(HAND_TOLERANCES) | {"margin_over_strongest", "largest_margins_at_r1",
                                                        "frozen_g_costs_up_to"}
    return S.specificity([CLAIMS[cid] for cid in CLAIMS if cid in read], n_sims=SIMS, resamples=100, seed=1,
                         correlation=CORRELATION, kinds=("null",), with_size=False).set_index("claim_id")


def test_no_claim_reported_supported_passes_the_world_its_rule_denies_more_than_a_tenth(worlds):
    """Every claim simulated in the world where it is false in the least favourable way (an "all K" rule
    with one item at no effect, a best-of rule with the runner-up equal on the compared column, a trajectory
    one step out of shape, a closeness claim on its own bound, a timing ratio on its threshold under a
    drifting load): a rule that passes it more than 10 % of the time is never reported supported."""
    measured = rule_specificity()
    for claim_id, claim in CLAIMS.items():
        row = with_specificity({"verdict": "supported", "paper_verdict": "supported", "reason": ""}, claim, measured)
        if row["verdict"] == "supported":
            # on simulation seed 1, not the file's seed 0, 100 reproductions: a share near the limit may move
            # by sampling noise (its SD at 0.10 is 0.03)
            assert worlds.loc[claim_id, "null_support"] <= NULL_SUPPORT_MAX + 0.06, claim_id
            assert row["null_support"] <= NULL_SUPPORT_MAX and row["size"] >= SIZE_MIN
            assert row["paper_verdict"] == "supported"
        else:
            assert row["verdict"] == "consistent" and "consistent, not supported" in row["reason"]


# The two rules of claims.yaml before this check (at 4b3c1e0), which their denied worlds catch: a count
# within a tie with one fraction at no effect, and a closeness band of 0.4 + 2 ties against a true 0.4
RULES_BEFORE = {"leads_at_every_fraction": {"statistic": {**CLAIMS["leads_at_every_fraction"]["statistic"],
                                                          "tolerance": "tie"}},
                "seeds_reproduce_within_04": {"decision": {"op": "<=", "threshold": "0.4 + 2 * tie"}}}


def test_the_denied_worlds_fail_the_rules_before_them():
    before = [{**CLAIMS[claim_id], **patch} for claim_id, patch in RULES_BEFORE.items()]
    null = S.specificity(before, n_sims=SIMS, resamples=100, seed=1, correlation=CORRELATION, kinds=("null",),
                         with_size=False).set_index("claim_id")["null_support"]
    assert null["leads_at_every_fraction"] > 0.4 and null["seeds_reproduce_within_04"] > 0.9


def test_an_all_k_rule_is_denied_with_one_item_at_no_effect_the_others_at_the_papers_values():
    claim = resolved(CLAIMS["leads_at_every_fraction"], paper_model(CORRELATION))
    worlds = S.world_of(claim, "null")
    items = sorted(W.paper_items(claim["statistic"]["contrast"]), key=lambda item: item.margin)
    assert len(worlds) == W.DENIED_ITEMS and len(items) == 8
    for world, item in zip(worlds, items):
        for part in item.column.parts:
            assert world.truth("tableA9", item.row, part, None) == printed("tableA9", item.competitor[1], part)
        other = next(i for i in items if i.row != item.row)
        assert world.truth("tableA9", other.row, other.column.parts[0], None) == \
            printed("tableA9", other.row, other.column.parts[0])


def test_a_best_of_rule_is_denied_with_the_runner_up_equal_on_the_compared_column():
    """The pooled column, not cell by cell: the best row on the Avg, all of its cells."""
    claim = resolved(CLAIMS["default_gamma_best_average"], paper_model(CORRELATION))
    (world,) = S.world_of(claim, "null")
    parts = [(b, d, "R@1") for b in ("docci", "dci", "long_dci", "urban1k") for d in ("t2i", "i2t")]
    others = ("gamma=0", "gamma=0.25", "gamma=0.75", "gamma=1")
    best = max(others, key=lambda row: np.mean([printed("table3a", row, p) for p in parts]))
    pooled = np.mean([world.truth("table3a", "gamma=0.5", p, None) - printed("table3a", best, p) for p in parts])
    assert pooled == pytest.approx(0.0, abs=1e-9)


def test_a_trajectory_is_denied_one_step_out_of_shape():
    claim = resolved(CLAIMS["frozen_g_peaks_at_epoch1"], paper_model(CORRELATION))
    worlds = S.world_of(claim, "null")
    assert len(worlds) == 2  # DCI, then Urban-1K: the peak one epoch later
    part = ("dci", "t2i", "R@1")
    first = worlds[0].truth("table3c", "frozen", part, 1)
    assert worlds[0].truth("table3c", "frozen", part, 2) == pytest.approx(first + claim["tie"])
    assert worlds[1].truth("table3c", "frozen", part, 2) < first  # the other benchmark keeps its shape
    monotone = resolved(CLAIMS["retrieval_error_monotone"], paper_model(CORRELATION))
    docci = ("docci", "t2i", "R@1")
    for world in S.world_of(monotone, "null"):
        (move,) = world.moves["table1", "hn_clip"]
        assert world.truth("table1", "hn_clip", docci, move.epoch) == pytest.approx(
            world.truth("table1", "hn_clip", docci, move.epoch - 1) - monotone["tie"])


# The hand-set tie tolerances these rules had before the formula (claims.yaml at 59dbb8f)
HAND_TOLERANCES = {"every_gamma_beats_zero": 4.75, "all_six_frameworks_in_domain": 3.5, "per_direction_35_of_36": 3.75,
                   "dci_to_docci_beats_in_domain": 2.75, "default_gamma_best_average": 1.5, "gamma_plateau": 4.0}


def test_the_same_check_fails_the_rules_without_the_gate(worlds):
    """The review's findings: hand-set tie tolerances that an absent effect passes nearly always; the
    formula's are narrower, and strict-sign and magnitude rules are informative."""
    hand = [with_tie(CLAIMS[cid], tol) for cid, tol in HAND_TOLERANCES.items()]
    before = S.specificity(hand, n_sims=SIMS, resamples=100, seed=1, correlation=CORRELATION, kinds=("null",),
                           with_size=False).set_index("claim_id")
    for claim_id in set(HAND_TOLERANCES) - {"gamma_plateau"}:  # the plateau's spread: with one seed effect per
        # run shared by its columns, its hand tolerance of 4.0 passes about 8 %
        assert before.loc[claim_id, "null_support"] > 0.4, (claim_id, before.loc[claim_id, "null_support"])
        assert worlds.loc[claim_id, "null_support"] <= before.loc[claim_id, "null_support"], claim_id
    # a tie is in the null world by construction ("best or within the tie"): only a narrower one can help
    assert worlds.loc[list(HAND_TOLERANCES), "null_support"].sum() < before["null_support"].sum() - 1.0
    null = worlds["null_support"]
    for claim_id in ("margin_over_strongest", "largest_margins_at_r1", "frozen_g_costs_up_to"):
        assert null[claim_id] <= NULL_SUPPORT_MAX, (claim_id, null[claim_id])


def test_every_rule_of_claims_yaml_has_its_specificity_measured():
    measured = rule_specificity()
    stale = [cid for cid, claim in CLAIMS.items() if measured.get(cid, {}).get("rule_hash") != rule_hash(claim)]
    assert not stale, f"rerun `python -m hnclip.claims.specificity` for {stale}"
    for entry in measured.values():
        assert 0.0 <= entry["size"] <= 1.0
        assert (entry["null_support"] is None) == (entry["reversed_support"] is None) == bool(entry["specificity_note"])
        if entry["null_support"] is not None:  # the reversed world is the null moved further against the claim
            assert entry["reversed_support"] <= entry["null_support"] + 0.05


def test_size_and_null_carry_the_one_correlation_they_were_measured_at():
    data = read_json(SPECIFICITY_FILE)
    rho = data["settings"]["correlation"]
    cells = {cid for cid, claim in CLAIMS.items() if S.batchable(claim["statistic"])}
    assert cells and all(data["claims"][cid]["correlation"] == rho for cid in cells)
    assert all(data["claims"][cid]["correlation"] is None for cid in set(CLAIMS) - cells)  # no retrieval cells
    assert set(data["sensitivity"]) == {f"{r:g}" for r in S.SENSITIVITY_CORRELATIONS}
    assert all(set(data["sensitivity"][r]) == cells for r in data["sensitivity"])


def _plain(claim: dict, shift: float = 0.0) -> S.World:
    """A claim's plain null (its compared rows equal), `shift` against the claim's direction."""
    world = S.World()
    assert W._leaves_into(claim["statistic"], world, [shift])
    return world


def test_the_plain_null_makes_the_compared_rows_equal_and_the_reversed_moves_them_a_point():
    claim = CLAIMS["every_gamma_beats_zero"]
    null, reversed_ = _plain(claim), _plain(claim, -S.SHIFT)
    zero = printed("table3a", "gamma=0", DOCCI_T2I)
    for gamma in ("gamma=0.25", "gamma=0.5", "gamma=0.75", "gamma=1"):
        assert null.truth("table3a", gamma, DOCCI_T2I, None) == zero
        assert reversed_.truth("table3a", gamma, DOCCI_T2I, None) == pytest.approx(zero - S.SHIFT)
    assert null.truth("table3a", "gamma=0", DOCCI_T2I, None) == zero
    # several b rows: the best of them; a claim that a row is lower is reversed upwards
    margin = _plain(CLAIMS["margin_over_strongest"])
    best = max(printed("table1", row, DOCCI_T2I) for row in ("longclip_zeroshot", "finelip", "goal", "structxlip"))
    assert margin.truth("table1", "hn_clip", DOCCI_T2I, None) == best
    assert W.claim_direction(CLAIMS["transfer_others_give_up"]) == -1
    # probes have no null world of rows
    assert isinstance(S.world_of(CLAIMS["saturation_epoch1"], "null"), str)


def test_a_closeness_claim_sits_on_the_edges_of_its_band_in_its_null_world():
    model = paper_model(read_json(SPECIFICITY_FILE)["settings"]["correlation"])
    part = ("long_dci", "t2i", "R@1")
    seeds = resolved(CLAIMS["seeds_reproduce_within_04"], model)
    bound = 0.4  # the claim's own bound, whatever the rule's threshold
    assert seeds["closeness_bound"] == bound
    for kind, beyond in (("null", 0.0), ("reversed", S.SHIFT)):
        above, below = S.world_of(seeds, kind)
        for method in ("hn_clip", "goal", "structxlip"):
            first = printed("tableA8", f"{method}/seed=42", part)
            assert above.truth("tableA8", f"{method}/seed=43", part, None) == pytest.approx(first + bound + beyond)
            assert below.truth("tableA8", f"{method}/seed=43", part, None) == pytest.approx(first - bound - beyond)
            assert above.truth("tableA8", f"{method}/seed=42", part, None) == first
    # a band on a signed statistic: the paper's pooled difference moved onto each edge
    with pytest.raises(ValueError, match="resolve its tie expressions"):
        S.world_of(CLAIMS["token_branch_alone_inert"], "null")
    band = resolved(CLAIMS["token_branch_alone_inert"], model)
    cells = [(b, d, "R@1") for b in ("dci", "long_dci") for d in ("t2i", "i2t")]
    for world, edge in zip(S.world_of(band, "null"), (band["decision"]["low"], band["decision"]["high"])):
        pooled = np.mean([world.truth("table3b", "tok=1,hn=0", c, None) - world.truth("table3b", "tok=0,hn=0", c, None)
                          for c in cells])
        assert pooled == pytest.approx(edge, abs=0.01)


def test_correlated_cells_are_unbiased_and_correlated_between_runs():
    rng = np.random.default_rng(0)
    pool = QueryPool(Bootstrap(BootstrapSettings(resamples=20, seed=0)), rng, paper_test_sizes())
    cells = S.WorldCells(pool, rng, 400, S.World(), 0.5)
    a = cells.cell("table1", "hn_clip", DOCCI_T2I, None).reshape(400, -1)
    b = cells.cell("table1", "goal", DOCCI_T2I, None).reshape(400, -1)
    assert a[:, 0].mean() == pytest.approx(printed("table1", "hn_clip", DOCCI_T2I), abs=0.1)
    assert b[:, 0].mean() == pytest.approx(printed("table1", "goal", DOCCI_T2I), abs=0.1)
    # a paired difference varies less than an independent one: between-run correlation of the estimates
    assert 0.15 < np.corrcoef(a[:, 0], b[:, 0])[0, 1] < 0.6
    # the bootstrap replicates of one reproduction spread as the query noise does
    n = paper_test_sizes()["docci"]
    p = printed("table1", "hn_clip", DOCCI_T2I) / 100
    assert a[:, 1:].std(axis=1).mean() == pytest.approx(100 * math.sqrt(p * (1 - p) / n), rel=0.25)


def test_the_gate_reports_consistent_where_the_null_support_is_high_the_size_low_or_unmeasured():
    claim = CLAIMS["every_gamma_beats_zero"]
    row = {"verdict": "supported", "paper_verdict": "supported", "reason": ""}
    entry = {"rule_hash": rule_hash(claim), "size": 0.97, "reversed_support": 0.5, "specificity_note": ""}
    high = with_specificity(row, claim, {claim["claim_id"]: {**entry, "null_support": 0.92}})
    assert (high["verdict"], high["paper_verdict"]) == ("consistent", "consistent")
    assert high["reason"] == ("consistent, not supported: the rule also says supported in 92% of simulated "
                              "reproductions without the effect")
    low = with_specificity(row, claim, {claim["claim_id"]: {**entry, "null_support": 0.04}})
    assert (low["verdict"], low["null_support"], low["size"]) == ("supported", 0.04, 0.97)
    small = with_specificity(row, claim, {claim["claim_id"]: {**entry, "null_support": 0.04, "size": 0.62}})
    assert small["verdict"] == "consistent" and small["reason"] == (
        "consistent, not supported: the rule says supported in only 62% of simulated exact reproductions of the paper")
    stale = with_specificity(row, claim, {claim["claim_id"]: {**entry, "null_support": 0.04, "rule_hash": "x"}})
    assert stale["verdict"] == "consistent" and "not measured for this rule" in stale["reason"]
    high_null = {claim["claim_id"]: {**entry, "null_support": 0.9}}
    other = with_specificity({**row, "verdict": "contradicted"}, claim, high_null)
    assert other["verdict"] == "contradicted"


@pytest.mark.parametrize(("decision", "value", "low", "high", "borderline"), [
    ({"op": ">", "threshold": 0}, 0.5, -1.46, 2.46, True),      # SE 1: 0.5 from the threshold
    ({"op": ">", "threshold": 0}, 3.0, 1.04, 4.96, False),
    ({"op": "between", "low": -1, "high": 1}, 0.9, 0.5, 1.3, True),
    ({"op": ">=", "threshold": 8}, 8.0, math.nan, math.nan, False),  # no interval, no standard error
])
def test_borderline_is_within_one_standard_error_of_the_threshold(decision, value, low, high, borderline):
    assert is_borderline(decision, value, low, high) is borderline


def test_the_between_run_correlation_is_measured_from_per_query_hits(tmp_path):
    """Runs whose latent outcomes correlate 0.5 (shared and own noise of equal variance): the correlation of
    their R@1 hits (rank 0), about (2/π)·asin(0.5) = 0.33 at a hit rate near 0.5, turned back into 0.5."""
    rng = np.random.default_rng(0)
    shared = rng.standard_normal(4000)
    for run in ("a", "b", "c"):
        latent = (shared + rng.standard_normal(4000)) / math.sqrt(2)
        ranks = np.where(latent < 0.25, 0, 1 + rng.integers(0, 50, 4000))  # a hit: rank 0
        record = {"best": {"metrics": {"ranks": {"t2i": ranks.tolist()}}}, "provenance": {"git": {"commit": "abc"}}}
        write_json(tmp_path / run / "docci.json", record)
    measured = C.outcome_correlation(tmp_path)
    assert measured["pairs"] == 3 and measured["records_of_commits"] == ["abc"] and measured["of"] == "R@1 hits"
    assert measured["correlation"] == pytest.approx(0.5, abs=0.06)
    assert measured["by_test_set"]["docci/t2i"]["runs"] == 3
    assert C.latent_correlation(2 / math.pi * math.asin(0.868), 0.5) == pytest.approx(0.868, abs=1e-6)
    with pytest.raises(ValueError, match="no evaluation records"):
        C.outcome_correlation(tmp_path / "empty")


def test_the_file_records_the_correlation_it_was_measured_with():
    settings = read_json(SPECIFICITY_FILE)["settings"]
    assert settings["correlation_measured"]["correlation"] == settings["correlation"]
    assert 0.0 < settings["correlation"] < 1.0 and settings["sims"] >= 200
