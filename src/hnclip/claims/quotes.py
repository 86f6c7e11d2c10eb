"""A claim's quote as a person reads it.

The paper's text extraction writes every inline formula twice, rendered and then as its LaTeX source:
"10−310^-3", "80%80\\%", "ℒHNL_HN", "0.580.58", "10610^6". claims.yaml keeps the quotes verbatim (the
tests find each in the extracted text); the scorecard's Markdown shows `readable_quote`: each doubled
formula once, from its source ("10^-3", "80 %", "L_HN", "0.58", "10^6").
"""
from __future__ import annotations

import re

# What the rendered half shows for a character of the LaTeX half
RENDERED = str.maketrans({"ℒ": "L", "−": "-", "–": "-"})
LATEX_ONLY = re.compile(r"[\\^_{}]")
EDGE_PUNCTUATION = "()[],;:.\"'“”"
OPERATOR_NAMES = {"cos", "sin", "log", "exp", "max", "min"}   # LaTeX's \\cos etc.: doubled without a digit
MATH = re.compile(r"[=<>≤≥∈α-ωΑ-Ω]")           # a relation or a Greek letter: "γ=0γ=0", "μ=0.47μ=0.47"
NUMBER = re.compile(r"[-+−]?\d[\d.,]*[%×]?(/[-+−]?\d[\d.,]*)?")


def _rendered(latex: str) -> str:
    """What the extraction's rendered half of a LaTeX fragment looks like, normalised."""
    return LATEX_ONLY.sub("", latex).translate(RENDERED)


def _readable(latex: str) -> str:
    return latex.replace("\\%", " %").replace("%", " %").replace("  %", " %")


def _undouble(token: str) -> str | None:
    """The readable form of a token that is a rendered formula followed by its source, else None."""
    for cut in range(1, len(token)):
        shown, source = token[:cut], token[cut:]
        if shown.translate(RENDERED) != _rendered(source):
            continue
        marked = (source != _rendered(source) or "ℒ" in shown or shown in OPERATOR_NAMES
                  or (any(c.isdigit() for c in source) and MATH.search(source) is not None))
        # a plain number doubled ("0.840.84", "8686"); one digit twice is a number of its own ("22 of 24")
        plain = NUMBER.fullmatch(source) is not None and len(source.strip("+-−")) > 1
        if marked or plain:
            return _readable(source)
    return None


def _word(word: str) -> str:
    whole = _undouble(word)   # a formula that ends in punctuation of its own, e.g. "γ∈[0.25,1]γ∈[0.25,1]"
    if whole is not None:
        return whole
    lead = len(word) - len(word.lstrip(EDGE_PUNCTUATION))
    body = word[lead:].rstrip(EDGE_PUNCTUATION)
    if not body:
        return word
    tail = word[lead + len(body):]
    whole = _undouble(body)
    if whole is None:  # a range of two formulas, e.g. "10210^2–10610^6"
        parts = body.split("–")
        undoubled = [_undouble(part) for part in parts]
        if len(parts) == 1 or all(u is None for u in undoubled):
            return word
        whole = "–".join(u if u is not None else p for u, p in zip(undoubled, parts))
    return word[:lead] + whole + tail


def readable_quote(quote: str) -> str:
    """The quote with each doubled formula shown once."""
    return " ".join(_word(word) for word in quote.split(" "))
