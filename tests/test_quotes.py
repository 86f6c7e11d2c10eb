"""Readable quotes (hnclip.claims.quotes): the extraction's doubled formulas shown once in the scorecard."""
import re

import pytest

from hnclip.claims.definitions import claim_definitions
from hnclip.claims.quotes import readable_quote


@pytest.mark.parametrize(("extracted", "readable"), [
    ("the loss falls below 10−310^-3 on 80%80\\% of batches", "the loss falls below 10^-3 on 80 % of batches"),
    ("on which ℒHNL_HN still produces loss", "on which L_HN still produces loss"),
    ("a per-run median of 10210^2–10610^6", "a per-run median of 10^2–10^6"),
    ("exceeds it by 10210^2–106×10^6× in", "exceeds it by 10^2–10^6× in"),
    ("8686–99%99\\% of all in-batch negatives", "86–99 % of all in-batch negatives"),
    ("(median cosine 0.580.58, positive", "(median cosine 0.58, positive"),
    ("GOAL is essentially unchanged (−0.6/+0.7-0.6/+0.7)", "GOAL is essentially unchanged (-0.6/+0.7)"),
    ("throughout (coscos μ=0.47μ=0.47, σ=0.36σ=0.36)", "throughout (cos μ=0.47, σ=0.36)"),
    ("every γ∈[0.25,1]γ∈[0.25,1] beats γ=0γ=0 in-domain", "every γ∈[0.25,1] beats γ=0 in-domain"),
    ("scores 85.00/83.1485.00/83.14 R@1", "scores 85.00/83.14 R@1"),
])
def test_a_doubled_formula_is_shown_once(extracted, readable):
    assert readable_quote(extracted) == readable


@pytest.mark.parametrize("text", ["22 of 24 columns", "three of four benchmarks", "(T→ ) and (I→ )",
                                  "the 2 runs", "papa bonbon 1 1"])
def test_text_without_doubled_formulas_is_unchanged(text):
    assert readable_quote(text) == text


def test_no_claim_quote_keeps_latex_source_or_a_doubled_number():
    for claim in claim_definitions():
        readable = readable_quote(claim["quote"])
        assert "\\%" not in readable and "ℒ" not in readable, (claim["claim_id"], readable)
        assert not re.search(r"(\d+\.\d+)\1", readable), (claim["claim_id"], readable)
