"""The gate on "supported" (hnclip.claims.verdicts.with_specificity) at its boundaries, and the headline
counts the rules give on the paper's own printed numbers."""
from collections import Counter
from pathlib import Path

import pytest

from hnclip.claims.definitions import NULL_SUPPORT_MAX, SIZE_MIN, claim_definitions, rule_hash, rule_specificity
from hnclip.claims.verdicts import paper_judgement, with_specificity

CLAIM = next(c for c in claim_definitions() if c["claim_id"] == "margin_over_strongest")


def _gated(size: float, null: float) -> dict:
    entry = {"rule_hash": rule_hash(CLAIM), "size": size, "null_support": null, "reversed_support": 0.0,
             "specificity_note": ""}
    row = {"verdict": "supported", "paper_verdict": "supported", "reason": ""}
    return with_specificity(row, CLAIM, {CLAIM["claim_id"]: entry})


@pytest.mark.parametrize(("size", "null", "verdict"), [
    (0.899, 0.0, "consistent"), (0.90, 0.0, "supported"),     # an exact reproduction passes at least 90 %
    (1.0, 0.10, "supported"), (1.0, 0.105, "consistent"),     # an absent effect passes at most 10 %
    (0.90, 0.10, "supported"), (0.899, 0.105, "consistent")])
def test_the_gate_at_its_boundaries(size, null, verdict):
    row = _gated(size, null)
    assert (row["verdict"], row["paper_verdict"]) == (verdict, verdict)
    assert (SIZE_MIN, NULL_SUPPORT_MAX) == (0.90, 0.10)


# The rules on the paper's own printed numbers, after the gate (docs/results.md "The paper's own numbers",
# README): the paper's claims, our additional checks, the sanity checks
HEADLINE = {"paper": {"supported": 20, "consistent": 34, "not_testable": 4},
            "additional": {"consistent": 1, "contradicted": 4, "not_testable": 1},
            "sanity": {"supported": 6}}


def test_the_headline_counts_on_the_papers_own_numbers():
    measured, counts = rule_specificity(), {key: Counter() for key in HEADLINE}
    for claim in claim_definitions():
        paper = paper_judgement(claim)
        row = with_specificity({"verdict": paper["paper_verdict"], "paper_verdict": paper["paper_verdict"],
                                "reason": ""}, claim, measured)
        part = "sanity" if claim.get("sanity_check") else claim.get("group", "paper")
        counts[part][row["paper_verdict"]] += 1
    assert {key: dict(value) for key, value in counts.items()} == HEADLINE


def test_the_docs_state_the_headline_counts():
    text = " ".join((Path(__file__).parents[1] / "docs" / "results.md").read_text().split())
    paper, total = HEADLINE["paper"], sum(HEADLINE["paper"].values())
    assert (f"the {total} claims the paper makes give **{paper['supported']} supported, {paper['consistent']} "
            f"consistent, 0 contradicted, 0 inconclusive, {paper['not_testable']} not testable**") in text
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert f"{paper['supported']} of its {total} claims are supported, {paper['consistent']} only consistent" in readme
