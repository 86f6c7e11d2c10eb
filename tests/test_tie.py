"""The claims' tie tolerance (hnclip.claims.tie): one formula, no hand values in claims.yaml."""
import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
import yaml

from hnclip.claims import tie as T
from hnclip.claims.definitions import claim_definitions

MODEL = T.TieModel({"docci": 5100, "urban1k": 1000}, correlation=0.8, seed_sd=0.5, seed_source="test")


def _exact_paired_variance(p: float, rho: float) -> float:
    """Var(X − Y) of two Bernoulli(p) hits {Z_1 < h}, {Z_2 < h}, (Z_1, Z_2) standard normal with correlation
    rho: X − Y has mean 0 and is ±1 exactly when the hits differ, so Var = P(X ≠ Y) = 2 (p − P(both)), with
    P(both) = ∫_{x<h} φ(x) Φ((h − rho x) / sqrt(1 − rho²)) dx (a fine grid; not the module's formula)."""
    h = NormalDist().inv_cdf(p)
    x = np.linspace(-9.0, h, 200_001)
    cdf = np.vectorize(NormalDist().cdf)((h - rho * x) / math.sqrt(1 - rho ** 2))
    density = np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)
    both = np.trapezoid(density * cdf, x) if hasattr(np, "trapezoid") else np.trapz(density * cdf, x)
    return 2 * (p - both)


@pytest.mark.parametrize("p", [0.5, 0.8, 0.9])
def test_the_query_term_is_the_exact_variance_of_a_paired_difference_of_hits(p):
    rho, n = 0.868, 1999
    model = T.TieModel({"dci": n}, correlation=rho, seed_sd=0.0, seed_source="test")
    exact = _exact_paired_variance(p, rho)
    assert model.query_variance(n, p) == pytest.approx(1e4 * exact / n, rel=1e-4)
    assert model.standard_error(n, p) == pytest.approx(100 * math.sqrt(exact / n), rel=1e-4)
    # the formula before, 2 · 0.25 · (1 − rho) (the latent correlation, p = 0.5), understated it 2.5x at p = 0.5,
    # 1.7x at 0.8 and 1.1x at 0.9
    assert exact / (2 * 0.25 * (1 - rho)) == pytest.approx({0.5: 2.50, 0.8: 1.75, 0.9: 1.08}[p], abs=0.01)


def test_the_hit_correlation_at_one_half_is_sheppards():
    for rho in (0.0, 0.5, 0.868, 0.95):
        assert T.hit_correlation(0.5, rho) == pytest.approx(2 / math.pi * math.asin(rho), abs=1e-9)
    assert T.hit_correlation(0.9, 0.868) < T.hit_correlation(0.5, 0.868)  # rarer misses correlate less


def test_the_formula():
    # p = 0.5: phi = (2/π) asin(0.8) = 0.5903; 100² · 2 · 0.25 · (1 − phi) / 1000 = 2.0485, seed term 2 · 0.25
    phi = 2 / math.pi * math.asin(0.8)
    assert MODEL.standard_error(1000) == pytest.approx(math.sqrt(1e4 * 0.5 * (1 - phi) / 1000 + 0.5))
    claim = {"claim_id": "x", "statistic": {"contrast": {"table": "none", "pairs": [],
                                                         "columns": {"benchmarks": ["docci", "urban1k"],
                                                                     "directions": ["t2i"], "metrics": ["R@1"]}}}}
    ties = MODEL.column_ties(claim["statistic"]["contrast"])
    assert ties == {"docci/t2i/R@1": pytest.approx(T.Z_TIE * MODEL.standard_error(5100)),
                    "urban1k/t2i/R@1": pytest.approx(T.Z_TIE * MODEL.standard_error(1000))}
    assert MODEL.tie(claim) == pytest.approx(T.Z_TIE * MODEL.standard_error(1000))  # the claim's: its largest


def test_a_mean_column_averages_its_cells_query_terms_and_keeps_the_whole_seed_term():
    both = MODEL.column_standard_error([("docci", 0.5), ("urban1k", 0.5)])
    query = (MODEL.query_variance(5100) + MODEL.query_variance(1000)) / 4
    assert both == pytest.approx(math.sqrt(query + 2 * 0.5 ** 2))


def test_each_item_gets_its_own_columns_tie():
    """A count over items of different test sets counts each against its own tie, not the smallest set's."""
    claim = yaml.safe_load("""
claim_id: c
statistic: {contrast: {table: table1, pairs: [[hn_clip, goal]],
                       columns: {benchmarks: [docci, urban1k], directions: [t2i], metrics: [R@1]}},
            reduce: count_positive, tolerance: tie}
decision: {op: ">=", threshold: 2}
""")
    model = T.paper_model(0.868)
    out = T.resolved(claim, model)
    ties = out["statistic"]["contrast"]["item_ties"]
    assert ties["docci/t2i/R@1"] < ties["urban1k/t2i/R@1"] == pytest.approx(out["tie"])


def test_the_seed_sds_interval_from_six_pairs():
    model = T.paper_model(0.868)
    low, high = model.seed_sd_interval()
    assert model.seed_pairs == 6
    # chi-square with 6 degrees of freedom: sd · sqrt(6 / 14.45) and sd · sqrt(6 / 1.237)
    assert (low, high) == (pytest.approx(0.3907 * 0.644, abs=0.005), pytest.approx(0.3907 * 2.202, abs=0.01))


@pytest.mark.parametrize("text, value", [("tie", 2.0), ("-tie", -2.0), ("0.4 + tie", 2.4), ("3.51 - tie", 1.51),
                                         ("-1 + tie", 1.0), ("2 * tie", 4.0), ("-2 * tie", -4.0),
                                         ("6.8 - 2 * tie", 2.8), (1.25, 1.25)])
def test_tie_expressions(text, value):
    assert T._value(text, 2.0) == pytest.approx(value)


def test_a_malformed_expression_is_an_error():
    with pytest.raises(ValueError, match="tie expression"):
        T._value("tie * 2", 1.0)


def test_resolved_replaces_every_tie_and_keeps_the_rule():
    claim = yaml.safe_load("""
claim_id: c
statistic: {contrast: {table: t, pairs: [[a, b]], columns: {benchmarks: [urban1k], directions: [t2i], metrics: [R@1]}},
            reduce: count_positive, tolerance: tie}
decision: {op: between, low: -tie, high: 0.4 + tie}
""")
    out = T.resolved(claim, MODEL)
    tie = T.Z_TIE * MODEL.standard_error(1000)  # a table the paper does not print: p = 0.5
    assert out["tie"] == pytest.approx(tie) and out["statistic"]["tolerance"] == pytest.approx(tie)
    assert out["decision"] == {"op": "between", "low": pytest.approx(-tie), "high": pytest.approx(0.4 + tie)}
    assert claim["statistic"]["tolerance"] == "tie"  # the definition itself is unchanged


def test_no_tolerance_of_claims_yaml_is_a_hand_value():
    """Every tie tolerance is the formula's: a statistic's `tolerance` is `tie` wherever it is stated, and
    no decision's threshold is the negative of a number that a sibling tolerance states."""
    def tolerances(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "tolerance":
                    yield value
                yield from tolerances(value)
        elif isinstance(node, list):
            for item in node:
                yield from tolerances(item)
    for claim in claim_definitions():
        stated = list(tolerances(claim["statistic"]))
        assert all(t == "tie" for t in stated), (claim["claim_id"], stated)
        if stated:
            assert T.uses_tie(claim)
            resolved = T.resolved(claim, T.paper_model(0.8))
            assert resolved["tie"] > 0


def test_the_seed_sd_of_a_table_of_seed_pairs(tmp_path):
    assert T.seed_variance([(1.0, 0.0), (0.0, 2.0)]) == pytest.approx((1 + 4) / 4)
    rows = [{"row": f"{m}/seed={s}", "benchmark": "long_dci", "direction": d, "metric": "R@1", "status": "ok",
             "ours_mean": v} for m, s, d, v in [("hn_clip", 42, "t2i", 50.0), ("hn_clip", 43, "t2i", 52.0),
                                              ("goal", 42, "i2t", 40.0), ("goal", 43, "i2t", 40.0)]]
    pd.DataFrame(rows).to_csv(tmp_path / "a8.csv", index=False)
    sd, source = T.table_seed_sd(tmp_path / "a8.csv")
    assert sd == pytest.approx(math.sqrt((4 + 0) / 4)) and "2 R@1 pairs" in source


def test_the_papers_seed_sd_is_table_a8s():
    sd, source = T.paper_seed_sd()
    # Table A8's six R@1 pairs of seeds 42 / 43 (HN-CLIP, GOAL, StructXLIP; T→I and I→T)
    assert sd == pytest.approx(0.3907, abs=1e-4) and "Table A8" in source


class _Cells:
    """A source of one number per (row, benchmark): the claims' statistic interpreter's cells."""

    def __init__(self, values: dict):
        self.values = values

    def has(self, table, row, part):
        return (row, part[0]) in self.values

    def cell(self, table, row, part, selection):
        return np.array([self.values[row, part[0]]])


def test_a_decision_at_the_claims_tie_judges_each_item_against_its_own():
    """`> -tie` over a minimum: DOCCI's item (5,100 queries) against DOCCI's tie, not Urban-1K's larger one."""
    from hnclip.claims.statistics import statistic_draws
    claim = yaml.safe_load("""
claim_id: c
statistic: {contrast: {table: table1, pairs: [[hn_clip, goal]],
                       columns: {benchmarks: [docci, urban1k], directions: [t2i], metrics: [R@1]}},
            reduce: min, tolerance: tie}
decision: {op: ">", threshold: "-tie"}
""")
    out = T.resolved(claim, T.paper_model(0.868))
    ties = out["statistic"]["contrast"]["item_ties"]
    small, large = ties["docci/t2i/R@1"], ties["urban1k/t2i/R@1"]
    assert out["statistic"]["item_tie_sign"] == 1 and small < large == pytest.approx(out["tie"])
    deficit = -(small + large) / 2  # within Urban-1K's tie, beyond DOCCI's
    values = {("hn_clip", "docci"): 50.0 + deficit, ("goal", "docci"): 50.0,
              ("hn_clip", "urban1k"): 60.0, ("goal", "urban1k"): 59.0}
    (value,) = statistic_draws(out["statistic"], _Cells(values))
    assert value == pytest.approx(deficit + small - large) and not value > out["decision"]["threshold"]
    values["hn_clip", "docci"] = 50.0 - 0.9 * small  # within DOCCI's own tie: passes
    (value,) = statistic_draws(out["statistic"], _Cells(values))
    assert value > out["decision"]["threshold"]
    # an Urban-1K item is compared with its own tie, the claim's largest: unchanged
    values.update({("hn_clip", "docci"): 51.0, ("hn_clip", "urban1k"): 59.0 - 0.9 * large})
    (value,) = statistic_draws(out["statistic"], _Cells(values))
    assert value == pytest.approx(-0.9 * large)
    assert T.item_tie_sign({"decision": {"op": ">=", "threshold": 8}}) is None
    assert T.item_tie_sign({"decision": {"op": "<=", "threshold": "tie"}}) == -1


def test_rho_is_measured_per_test_set_and_direction_from_paired_hits_else_the_fallback(tmp_path):
    from hnclip.claims.correlation import test_set_correlations
    from hnclip.io import write_json
    rng = np.random.default_rng(0)
    shared = rng.standard_normal(3000)
    files = []
    for run in ("a", "b"):
        latent = (shared + rng.standard_normal(3000)) / math.sqrt(2)  # latent correlation 0.5
        record = {"best": {"metrics": {"ranks": {"t2i": np.where(latent < 0, 0, 3).tolist()}}}}
        files.append(tmp_path / run / "docci.json")
        write_json(files[-1], record)
    measured = test_set_correlations(files)
    assert list(measured) == ["docci/t2i"] and measured["docci/t2i"] == pytest.approx(0.5, abs=0.07)
    assert test_set_correlations(files[:1]) == {}  # one run: nothing paired, the fallback
    model = T.TieModel({"docci": 5100, "urban1k": 1000}, 0.868, 0.39, "test", measured=tuple(measured.items()))
    assert model.correlation_of("docci", "t2i") == (measured["docci/t2i"], "measured")
    assert model.correlation_of("docci", "i2t") == (0.868, "fallback")
    spec = {"columns": {"benchmarks": ["docci"], "directions": ["t2i", "i2t"], "metrics": ["R@1"]}}
    ties = model.column_ties(spec)
    fallback = T.TieModel({"docci": 5100}, 0.868, 0.39, "test").column_ties(spec)
    assert ties["docci/t2i/R@1"] > fallback["docci/t2i/R@1"]  # less correlated runs: a wider tie
    assert ties["docci/i2t/R@1"] == pytest.approx(fallback["docci/i2t/R@1"])
    used = T.claim_correlations({"statistic": {"contrast": spec}}, model)
    assert used == {"docci/i2t": {"rho": 0.868, "source": "fallback"},
                    "docci/t2i": {"rho": measured["docci/t2i"], "source": "measured"}}
