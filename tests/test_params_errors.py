"""ParamsError messages: each schema error names its dotted key and what is allowed, the most relevant
sub-error of a oneOf/anyOf is the one reported, and several errors stay readable on one line (the
CLI prints a UserError as one line)."""
from __future__ import annotations

import pytest
import yaml

from hnclip.config.params import MAX_REPORTED, ParamsError, validate_params

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "recipe": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"epochs": {"type": "integer"}, "lr": {"type": "number"},
                           "margin": {"enum": ["live", "frozen"]}},
        },
        # a backbone is named, or described: the name's allowed values are the useful part of a bad name
        "backbone": {"anyOf": [
            {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            {"type": "string", "enum": ["vit_b16", "vit_l14"]},
        ]},
        "seeds": {"type": "array", "items": {"type": "integer"}},
    },
}


@pytest.fixture
def schema_path(tmp_path):
    path = tmp_path / "params.schema.yaml"
    path.write_text(yaml.safe_dump(SCHEMA))
    return path


def message_of(params, schema_path) -> str:
    with pytest.raises(ParamsError) as error:
        validate_params(params, schema_path)
    return str(error.value)


def test_wrong_enum_value_names_the_key_and_the_allowed_values(schema_path):
    assert message_of({"recipe": {"margin": "stale"}}, schema_path) == \
        "params.yaml: recipe.margin: 'stale' is not one of ['live', 'frozen']"


def test_misspelled_key_names_the_allowed_keys(schema_path):
    assert message_of({"recipe": {"lr_typo": 1}}, schema_path) == (
        "params.yaml: recipe: Additional properties are not allowed ('lr_typo' was unexpected), "
        "allowed keys: ['epochs', 'lr', 'margin']")


def test_type_error_names_the_key(schema_path):
    assert message_of({"recipe": {"epochs": "ten"}}, schema_path) == \
        "params.yaml: recipe.epochs: 'ten' is not of type 'integer'"


def test_the_most_relevant_branch_of_an_any_of_is_reported(schema_path):
    # both branches fail at the same key; the one whose type matches says what a valid name is
    assert message_of({"backbone": "vit_h"}, schema_path) == \
        "params.yaml: backbone: 'vit_h' is not one of ['vit_b16', 'vit_l14']"


def test_several_errors_one_per_line_and_readable_as_one_line(schema_path):
    message = message_of({"recipe": {"epochs": "ten", "margin": "stale"}, "seeds": [1, "two"]}, schema_path)
    lines = message.splitlines()
    assert len(lines) == 3 and lines[0].startswith("params.yaml: ")
    assert [line.removeprefix("params.yaml: ").rstrip(";") for line in lines] == [  # shallower keys first
        "recipe.epochs: 'ten' is not of type 'integer'",
        "recipe.margin: 'stale' is not one of ['live', 'frozen']",
        "seeds.1: 'two' is not of type 'integer'",
    ]
    one_line = " ".join(message.split())  # what `hnclip` prints
    assert one_line.startswith("params.yaml: ") and one_line.count("params.yaml") == 1
    assert one_line.count("; ") == 2


def test_at_most_max_reported_errors_are_named(schema_path):
    seeds = ["x"] * (MAX_REPORTED + 3)
    lines = message_of({"seeds": seeds}, schema_path).splitlines()
    assert len(lines) == MAX_REPORTED + 1
    assert lines[-1] == "and 3 more"
    assert [line.removeprefix("params.yaml: ").rstrip(";") for line in lines[:-1]] == \
        [f"seeds.{i}: 'x' is not of type 'integer'" for i in range(MAX_REPORTED)]
