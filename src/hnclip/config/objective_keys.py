"""The training objective's keys, declared once: each key a method's objective may set in params.yaml,
what it means, its allowed values and its default.

Readers: the registry builds a run's objective, and so its run id, from this table (`run_objective`);
the losses read an objective through it (`margin_source`, `margin_control`, `MARGIN_CONTROLS`); and
tests/test_objective_keys.py holds workflow/schemas/params.schema.yaml's entries for these keys equal to
`json_schema` of this table (the schema file cannot import Python). Every key here changes training and
is part of the run id: a required key always, an optional one when it is set to another value than its
default (so adding an optional key keeps every existing run id). A method key that is neither here nor
one of the method's other settings (its label, training fraction, learning-rate scales, recipe,
framework settings, adapter) is rejected by the schema.

One name per concept. `margin` is the params.yaml key of the *margin source* (G from the live text
encoder or from a frozen copy of the initial one); the key keeps its name because it is part of every run
id, and the code calls the concept `margin_source`. The other margin concepts: `margin_control` (Table
X1's replacement of G_bar), the *margin features* (the text features G is the cosine matrix of,
`g_features`) and the *shuffle key* (the (epoch, micro-batch) of a contrastive group, which seeds
its shuffled margins). FineLIP's `frameworks.finelip.margin` is that framework's hinge margin, a setting
of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hnclip.config.constants import RUNNABLE_FRAMEWORKS, TRAINED_FRAMEWORKS

ZEROSHOT_FRAMEWORK = "none"   # evaluated as released: no training
MARGIN_SOURCES = ("live", "frozen")
MARGIN_CONTROLS = ("none", "constant", "shuffled")


@dataclass(frozen=True)
class ObjectiveKey:
    name: str
    meaning: str
    values: tuple[str, ...] = ()   # the allowed values of a choice; () for a number
    minimum: float | None = None   # a number's least value
    default: Any = None            # None: every method sets it; else optional, and absent means this value
    frameworks: tuple[str, ...] = ()   # the frameworks that read it (a non-default value elsewhere is an
                                       # error); (): every framework
    margin_setting: bool = False   # a setting of L_HN's margins: moot at gamma 0, so left out of the run id there

    @property
    def required(self) -> bool:
        return self.default is None

    def json_schema(self) -> dict:
        """The key's entry in params.schema.yaml's `method_fields`."""
        if self.values:
            return {"enum": list(self.values)}
        return {"type": "number", "minimum": self.minimum}


OBJECTIVE_KEYS = (
    ObjectiveKey("framework", "what is trained; `none`: the backbone evaluated as released",
                 values=(ZEROSHOT_FRAMEWORK, *RUNNABLE_FRAMEWORKS)),
    ObjectiveKey("gamma", "the margin strength: L_HN (paper Eq. 2) when > 0, plain InfoNCE at 0", minimum=0),
    ObjectiveKey("lambda_tok", "the weight of the token-level term L_tok", minimum=0),
    ObjectiveKey("margin", "the margin source: G from the live text encoder, or from a frozen copy of the initial one",
                 values=MARGIN_SOURCES),
    ObjectiveKey("margin_control", "Table X1's controls of G_bar: `constant` gives every negative the batch's mean "
                 "margin, `shuffled` permutes the pairs' margins within the batch; `none`: G_bar itself",
                 values=MARGIN_CONTROLS, default="none", frameworks=TRAINED_FRAMEWORKS, margin_setting=True),
)
KEYS = {key.name: key for key in OBJECTIVE_KEYS}


def value(objective: dict, name: str) -> Any:
    """An objective's value of a key: its own, or the key's default where it leaves an optional key out."""
    return objective[name] if KEYS[name].required else objective.get(name, KEYS[name].default)


def margin_source(objective: dict) -> str:
    """live or frozen (params.yaml's `margin`)."""
    return value(objective, "margin")


def margin_control(objective: dict) -> str:
    """none (G_bar itself), constant or shuffled."""
    return value(objective, "margin_control")


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
    """The objective's part of a run's identity: every required key, then each option set to another value
    than its default, except margin settings at gamma 0 (no margin to set: the run is InfoNCE's). gamma
    and lambda_tok are floats, so 1 and 1.0 name one run."""
    identity = {key.name: objective[key.name] for key in OBJECTIVE_KEYS if key.required}
    identity.update({name: objective[name] for name in set_options(objective)
                     if objective["gamma"] > 0 or not KEYS[name].margin_setting})
    return {name: v if KEYS[name].values else float(v) for name, v in identity.items()}
