"""The objective's keys are declared once (hnclip.config.objective_keys): the schema's entries for them are
the table's, an unknown method key is an error naming it and the allowed keys, every key that changes
training is in the run id (by its identity name, cast to its kind), an optional key changes the run id
only when set to another value than its default and the readable id then shows it, and the losses read
their allowed values from the table."""
from __future__ import annotations

import pytest
import yaml

from hnclip.config import objective_keys
from hnclip.config.objective_keys import OBJECTIVE_KEYS, ZEROSHOT_FRAMEWORK
from hnclip.config.params import SCHEMA_RELPATH, ParamsError, validate_params
from hnclip.config.registry import Registry

NOT_OBJECTIVE = ["adapter", "fraction", "label", "lr_scale", "module_lr_scale", "recipe_overrides",
                 "settings"]  # the other keys of a method


@pytest.fixture(scope="module")
def schema(project_root) -> dict:
    return yaml.safe_load((project_root / SCHEMA_RELPATH).read_text())


def resolved(schema: dict, entry: dict) -> dict:
    """A schema entry with its local `$ref` followed."""
    while "$ref" in entry:
        target = schema
        for part in entry["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        entry = target
    return entry


def test_the_schema_declares_the_objective_keys_as_the_table_does(schema):
    fields = schema["$defs"]["method_fields"]["properties"]
    for key in OBJECTIVE_KEYS:
        assert resolved(schema, fields[key.name]) == key.json_schema(), key.name
    method = schema["properties"]["methods"]["additionalProperties"]
    assert method["required"] == ["label", *(key.name for key in OBJECTIVE_KEYS if key.required)]
    # nothing else a method may set is an objective key the table misses
    assert sorted(set(fields) | set(method["properties"])) == sorted([k.name for k in OBJECTIVE_KEYS] + NOT_OBJECTIVE)


@pytest.mark.parametrize("where", ["method", "row"])
def test_an_unknown_method_key_is_rejected_naming_it_and_the_allowed_keys(params, in_project, where):
    if where == "method":
        params["methods"]["hn_clip"]["margin_contrl"] = "constant"  # a misspelt key would not be in the run id
    else:
        params["tables"]["table3c"]["rows"][0]["set"] = {"margin_contrl": "constant"}
    with pytest.raises(ParamsError) as error:
        validate_params(params)
    message = str(error.value)
    allowed = sorted([key.name for key in OBJECTIVE_KEYS] + NOT_OBJECTIVE) if where == "method" else \
        sorted([key.name for key in OBJECTIVE_KEYS] + [k for k in NOT_OBJECTIVE if k != "label"])
    path = "methods.hn_clip" if where == "method" else "tables.table3c.rows.0.set"
    assert f"{path}: unknown key(s) ['margin_contrl']" in message
    assert f"allowed keys: {allowed}" in message


def other_value(key: objective_keys.ObjectiveKey, current):
    """A value of the key other than `current` (a trained framework, not the zero-shot one)."""
    if key.kind == objective_keys.NUMBER:
        return current + 0.25
    if key.kind == objective_keys.INTEGER:
        return current + 4
    return next(v for v in key.values if v not in (current, ZEROSHOT_FRAMEWORK))


@pytest.mark.parametrize("key", OBJECTIVE_KEYS, ids=lambda key: key.name)
def test_every_objective_key_is_in_the_run_id(params, in_project, key):
    reg = Registry(params)
    hn_clip = params["methods"]["hn_clip"]
    before = reg.run_spec("docci", hn_clip, 42, register=False)
    changed = {**hn_clip, key.name: other_value(key, objective_keys.value(hn_clip, key.name))}
    after = reg.run_spec("docci", changed, 42, register=False)
    assert after.run_id != before.run_id
    assert after.spec["objective"][key.identity_name] == changed[key.name]


@pytest.mark.parametrize("key", [key for key in OBJECTIVE_KEYS if not key.required], ids=lambda key: key.name)
def test_an_optional_key_changes_the_run_id_only_when_set_to_another_value_than_its_default(params, in_project,
                                                                                           key):
    reg = Registry(params)
    hn_clip = params["methods"]["hn_clip"]
    assert key.name not in hn_clip
    old = reg.run_spec("docci", hn_clip, 42, register=False).run_id
    assert reg.run_spec("docci", {**hn_clip, key.name: key.default}, 42, register=False).run_id == old
    for value in [v for v in key.values if v != key.default] or [other_value(key, key.default)]:
        new = reg.run_spec("docci", {**hn_clip, key.name: value}, 42, register=False).run_id
        assert new != old, value
        # the readable part shows it, in the key's short form, where HN-CLIP's is otherwise the same
        shown = key.shown(key.cast(value))
        assert new.split("-")[:-1] == old.split("-")[:4] + [shown] + old.split("-")[4:-1], new
    if key.margin_setting:  # at gamma 0 there is no margin to set: the run is plain InfoNCE's
        ft = params["methods"]["longclip_ft"]
        assert reg.run_spec("docci", {**ft, key.name: other_value(key, key.default)}, 42, register=False).run_id \
            == reg.run_spec("docci", ft, 42, register=False).run_id


def test_an_option_the_framework_does_not_read_is_an_error(params, in_project):
    key = next(key for key in OBJECTIVE_KEYS if key.frameworks)
    framework = next(f for f in objective_keys.KEYS["framework"].values if f not in key.frameworks)
    method = next(name for name, m in params["methods"].items() if m["framework"] == framework)
    params["methods"][method][key.name] = other_value(key, key.default)
    with pytest.raises(ParamsError, match=rf"methods\.{method}: {key.name} is available for the frameworks"):
        Registry(params)


def test_the_losses_read_the_margin_controls_from_the_table():
    torch = pytest.importorskip("torch")
    from hnclip.losses import MARGIN_CONTROLS, margin_matrix
    assert MARGIN_CONTROLS is objective_keys.MARGIN_CONTROLS
    with pytest.raises(ValueError) as error:
        margin_matrix(torch.eye(3), 0.5, "random")
    assert f"allowed values: {list(MARGIN_CONTROLS)}" in str(error.value)


def test_each_kind_is_cast_so_that_one_value_names_one_run(params, in_project):
    """A number is a float (gamma 1 and 1.0 name one run), an integer stays an int, a choice as it is."""
    reg = Registry(params)
    hn_clip = params["methods"]["hn_clip"]
    spec = reg.run_spec("docci", {**hn_clip, "gamma": 1, "lambda_tok": 1}, 42, register=False).spec
    assert type(spec["objective"]["gamma"]) is float and type(spec["objective"]["lambda_tok"]) is float
    assert reg.run_spec("docci", {**hn_clip, "gamma": 1.0}, 42, register=False).run_id == \
        reg.run_spec("docci", {**hn_clip, "gamma": 1}, 42, register=False).run_id
    number = objective_keys.ObjectiveKey("n", "a number", kind=objective_keys.NUMBER, minimum=0, default=0.0)
    integer = objective_keys.ObjectiveKey("k", "an integer", kind=objective_keys.INTEGER, minimum=0, default=0,
                                          short="k{}")
    assert (number.cast(1), integer.cast(4.0), integer.shown(4)) == (1.0, 4, "k4")
    assert type(integer.cast(4.0)) is int
    assert integer.json_schema() == {"type": "integer", "minimum": 0, "description": "an integer"}
    with pytest.raises(ValueError, match="a choice needs values"):
        objective_keys.ObjectiveKey("c", "a choice without values")


def test_the_run_identity_keeps_the_historical_name_of_the_g_source(params, in_project):
    """params.yaml says `g_source`; the hashed spec (and so every run id) still says `margin`, and the
    accessors read an objective by either name."""
    reg = Registry(params)
    frozen = reg.run_spec("docci", params["methods"]["hn_clip_frozen_g"], 42, register=False)
    assert frozen.spec["objective"]["margin"] == "frozen" and "g_source" not in frozen.spec["objective"]
    assert "-frozen-" in frozen.run_id
    assert objective_keys.g_source(frozen.spec["objective"]) == "frozen"
    assert objective_keys.g_source(params["methods"]["hn_clip_frozen_g"]) == "frozen"
    assert objective_keys.record(params["methods"]["hn_clip"]) == {
        key.identity_name: key.cast(objective_keys.value(params["methods"]["hn_clip"], key.name))
        for key in OBJECTIVE_KEYS}
