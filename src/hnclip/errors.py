"""Errors a user can fix. Their message names the cause and what to do; `hnclip` prints it as one
line and exits 2. Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Base of every error whose message is the whole story (bad input, stale artifact, ...)."""


class StaleArtifactError(UserError, RuntimeError):
    """An artifact no longer matches the record that produced it (replaced file, changed settings)."""


class UnknownNameError(UserError, LookupError):
    """A table, run, benchmark, figure or setting that the registry does not know."""


def close_names(name: object, known: Iterable[object], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The known names closest to a misspelt one, best first (difflib's similarity, case ignored): at most
    `n`, each at least `cutoff` similar and within 0.1 of the best, so that one clear match comes alone.
    [] when nothing is close, or when every known name would be named (the list itself says as much)."""
    if not isinstance(name, str) or not name:
        return []
    known = list(dict.fromkeys(str(k) for k in known if k != name))
    if not known:
        return []
    scores = sorted(((difflib.SequenceMatcher(None, name.lower(), k.lower()).ratio(), k) for k in known),
                    key=lambda pair: -pair[0])
    best = scores[0][0]
    names = [k for score, k in scores if score >= max(cutoff, best - 0.1)][:n]
    return [] if len(names) == len(known) > 1 else names


def did_you_mean(name: object, known: Iterable[object]) -> str:
    """"; did you mean 'x'?" (or "'x' or 'y'") naming the known names closest to `name`; "" if none is close."""
    names = close_names(name, known)
    return f"; did you mean {' or '.join(map(repr, names))}?" if names else ""


def did_you_mean_each(names: Iterable[object], known: Iterable[object]) -> str:
    """did_you_mean for several unknown names: "; did you mean 'x'?" for one, "; did you mean 'x' for 'a',
    'y' for 'b'?" for several (those with a close known name); "" if none has one."""
    names, known = list(names), list(known)
    if len(names) == 1:
        return did_you_mean(names[0], known)
    guesses = [(name, close_names(name, known)) for name in names]
    parts = [f"{' or '.join(map(repr, close))} for {name!r}" for name, close in guesses if close]
    return f"; did you mean {', '.join(parts)}?" if parts else ""


def unknown_name(where: str, kind: str, name: object, known: Iterable[object], note: str = "") -> str:
    """One problem of a params file: "<where>: unknown <kind> 'x'<note>; allowed values: [...]; did you mean
    'y'?" (where: the dotted key, kind: what the name should name, note: e.g. the table row)."""
    known = sorted(known)
    return f"{where}: unknown {kind} {name!r}{note}; allowed values: {known}{did_you_mean(name, known)}"
