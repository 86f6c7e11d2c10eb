"""The training objective's keys, declared once: each key a method's objective may set in params.yaml,
what it means, its kind and allowed values, its default, its part of the readable run id and its name in
a run's identity.

Readers: the registry builds a run's objective (`run_objective`) and the readable part of its run id
(`readable_parts`) from this table; the losses read an objective through it (`g_source`, `margin_control`,
and `margin_settings`, every margin setting by name for `margin_matrix`); the gradient probe records every
key (`record`); and tests/test_objective_keys.py holds
workflow/schemas/params.schema.yaml's entries for these keys equal to `json_schema` of this table (the
schema file cannot import Python). Every key here changes training and is part of the run id: a required
key always, an optional one when it is set to another value than its default (so adding an optional key
keeps every existing run id), and the readable id then shows it in its short form. A method key that is
neither here nor one of the method's other settings (its label, training fraction, learning-rate scales,
recipe overrides, framework settings, adapter) is rejected by the schema.

Kinds: a *choice* takes one of its string values; a *number* is a float (1 and 1.0 name one run); an
*integer* is kept an int.

One name per concept (docs/pipeline.md's glossary). `g_source` is where G, the caption-caption cosine
matrix, comes from: the live text encoder or a frozen copy of the initial one. A *margin* is the gap a
positive's logit must clear over a negative's: in L_HN, gamma * G_bar (paper Eq. 2), and FineLIP's
`frameworks.finelip.margin` is a margin in the same sense (that framework's hinge margin, a setting of its
own); `margin_control` is Table X1's replacement of G_bar, a control of the margin. The *G features* are the
text features G is the cosine matrix of (`g_features`), and the *shuffle key* (`ShuffleKey`) is the (epoch,
micro-batch) of a contrastive group, which seeds its shuffled margins. A method's *recipe overrides*
(`recipe_overrides:`) change the profile's training recipe for its runs; the *recipe* is only the run's
training recipe (the profile's `recipe:` with those overrides merged, a spec's `recipe`).

Identity names. A run's identity (its hashed spec, and so its run id, and the `objective` dict stored in
its records) names each key by its `identity_name`. That is the key's name but for `g_source`, which was
called `margin` when the first runs were identified: renaming it in the identity would change every run
id and orphan every trained run and record, so the identity keeps `margin` (as does a pretraining run's
literal objective in hnclip.config.registry). `value` reads an objective by either name: a method's
(params.yaml names) and a run's (identity names) alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hnclip.config.constants import RUNNABLE_FRAMEWORKS, TRAINED_FRAMEWORKS

ZEROSHOT_FRAMEWORK = "none"   # evaluated as released: no training
G_SOURCES = ("live", "frozen")
MARGIN_CONTROLS = ("none", "constant", "shuffled")
CHOICE, NUMBER, INTEGER = "choice", "number", "integer"   # the kinds of key
KINDS = (CHOICE, NUMBER, INTEGER)


@dataclass(frozen=True)
class ObjectiveKey:
    name: str                      # the params.yaml key (a method's, a table row's `set`)
    meaning: str                   # also the schema entry's description
    kind: str = CHOICE
    values: tuple[str, ...] = ()   # the allowed values of a choice
    minimum: float | None = None   # a number's or an integer's least value
    default: Any = None            # None: every method sets it; else optional, and absent means this value
    frameworks: tuple[str, ...] = ()   # the frameworks that read it (a non-default value elsewhere is an
                                       # error); (): every framework
    margin_setting: bool = False   # a setting of L_HN's margins: moot at gamma 0, so left out of the run id there
    short: str = "{}"              # its part of the readable run id, `{}` the value (a number as %g)
    short_omitted: tuple = ()      # values the readable run id leaves out
    identity_name: str = ""        # its name in a run's identity where not `name` (see the module docstring)

    def __post_init__(self):
        if self.kind not in KINDS or (self.kind == CHOICE) != bool(self.values):
            raise ValueError(f"objective key {self.name!r}: a choice needs values, a number or integer none")
        if not self.identity_name:
            object.__setattr__(self, "identity_name", self.name)

    @property
    def required(self) -> bool:
        return self.default is None

    def cast(self, v: Any) -> Any:
        """The value as a run's identity holds it: a number as a float (1 and 1.0 name one run), an integer
        as an int, a choice as it is."""
        return float(v) if self.kind == NUMBER else int(v) if self.kind == INTEGER else v

    def shown(self, v: Any) -> str:
        """The value's part of the readable run id ('' where the id leaves it out)."""
        if v in self.short_omitted:
            return ""
        return self.short.format(f"{v:g}" if self.kind == NUMBER else v)

    def json_schema(self) -> dict:
        """The key's entry in params.schema.yaml's `method_fields`."""
        entry = {"enum": list(self.values)} if self.kind == CHOICE else {"type": self.kind}
        if self.minimum is not None:
            entry["minimum"] = self.minimum
        return {**entry, "description": self.meaning}


OBJECTIVE_KEYS = (
    ObjectiveKey("framework", "what is trained; `none`: the backbone evaluated as released",
                 values=(ZEROSHOT_FRAMEWORK, *RUNNABLE_FRAMEWORKS), short_omitted=("full",)),
    ObjectiveKey("gamma", "the margin strength: L_HN (paper Eq. 2) when > 0, plain InfoNCE at 0", kind=NUMBER,
                 minimum=0, short="g{}"),
    ObjectiveKey("lambda_tok", "the weight of the token-level term L_tok", kind=NUMBER, minimum=0, short="tok{}"),
    ObjectiveKey("g_source", "where G comes from: the live text encoder, or a frozen copy of the initial one",
                 values=G_SOURCES, identity_name="margin"),
    ObjectiveKey("margin_control", "Table X1's controls of G_bar: `constant` gives every negative the batch's mean "
                 "margin, `shuffled` permutes the pairs' margins within the batch; `none`: G_bar itself",
                 values=MARGIN_CONTROLS, default="none", frameworks=TRAINED_FRAMEWORKS, margin_setting=True),
)
KEYS = {key.name: key for key in OBJECTIVE_KEYS}


def value(objective: dict, name: str) -> Any:
    """An objective's value of a key, by its name or its identity name (a method's objective or a run's):
    its own, or the key's default where it leaves an optional key out."""
    key = KEYS[name]
    for spelling in (key.name, key.identity_name):
        if spelling in objective:
            return objective[spelling]
    if key.required:
        raise KeyError(f"the objective {objective} has no {name!r}")
    return key.default


def g_source(objective: dict) -> str:
    """live or frozen: where G comes from."""
    return value(objective, "g_source")


def margin_control(objective: dict) -> str:
    """none (G_bar itself), constant or shuffled."""
    return value(objective, "margin_control")


def margin_settings(objective: dict) -> dict:
    """Every margin setting's value in an objective, by its key's name: the keyword arguments the losses
    hand to hnclip.losses.objective.margin_matrix (a new margin setting is a key here and a parameter
    there, and nothing in between)."""
    return {key.name: value(objective, key.name) for key in OBJECTIVE_KEYS if key.margin_setting}


def margin_defaults() -> dict:
    """Every margin setting at its default: the margins of a gamma-0 run's identity (it has none)."""
    return {key.name: key.default for key in OBJECTIVE_KEYS if key.margin_setting}


def set_options(objective: dict) -> list[str]:
    """The optional keys an objective (a method, or a row's settings over it) sets to another value than
    their defaults."""
    return [key.name for key in OBJECTIVE_KEYS if not key.required and value(objective, key.name) != key.default]


def misplaced_options(objective: dict) -> list[str]:
    """The options set to a non-default value that its framework does not read (it would ignore them)."""
    return [name for name in set_options(objective)
            if KEYS[name].frameworks and objective["framework"] not in KEYS[name].frameworks]


def run_objective(objective: dict) -> dict:
    """The objective's part of a run's identity, by identity names: every required key, then each option
    set to another value than its default, except margin settings at gamma 0 (no margin to set: the run is
    InfoNCE's); each value cast to its kind."""
    names = [key.name for key in OBJECTIVE_KEYS if key.required]
    names += [name for name in set_options(objective) if objective["gamma"] > 0 or not KEYS[name].margin_setting]
    return {KEYS[name].identity_name: KEYS[name].cast(value(objective, name)) for name in names}


def readable_parts(identity: dict) -> list[str]:
    """A run objective's (`run_objective`) part of the readable run id: the short form of each key it
    holds, in the table's order (`docci-g0.5-tok1-live-…`; the framework `full` and every option at its
    default are left out)."""
    return [part for key in OBJECTIVE_KEYS if key.identity_name in identity
            for part in [key.shown(identity[key.identity_name])] if part]


def record(objective: dict) -> dict:
    """Every key's value in an objective (the option's default where it leaves one out), by identity
    names as a run's records name them: what a gradient-probe record says it measured."""
    return {key.identity_name: key.cast(value(objective, key.name)) for key in OBJECTIVE_KEYS}
