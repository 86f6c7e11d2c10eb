"""The claims' tie tolerance (hnclip.claims.tie): one formula, no hand values in claims.yaml."""
import math

import pandas as pd
import pytest
import yaml

from hnclip.claims import tie as T
from hnclip.claims.definitions import claim_definitions

MODEL = T.TieModel({"docci": 5100, "urban1k": 1000}, correlation=0.8, seed_sd=0.5, seed_source="test")


def test_the_formula():
    # 100² · 2 · 0.25 · 0.2 / 1000 = 1.0 (query term) and 2 · 0.25 = 0.5 (seed term)
    assert MODEL.standard_error(1000) == pytest.approx(math.sqrt(1.5))
    claim = {"claim_id": "x", "statistic": {"contrast": {"columns": {"benchmarks": ["docci", "urban1k"]}}}}
    assert MODEL.tie(claim) == pytest.approx(T.Z_TIE * math.sqrt(1.5))  # the smallest test set decides


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
    tie = T.Z_TIE * math.sqrt(1.5)
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
