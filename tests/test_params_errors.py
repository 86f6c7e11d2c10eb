"""ParamsError messages: each schema error names its dotted key and what is allowed, the most relevant
sub-error of a oneOf/anyOf is the one reported, and several errors stay readable on one line (the
CLI prints a UserError as one line). Errors teach: a misspelt name or key gets the closest known ones
("did you mean ...?"), a schema error the key's description, and every problem of a file, of the schema
or of its cross-references (hnclip.config.registry), is reported at once, each where it is."""
from __future__ import annotations

import pytest
import yaml

from hnclip.config.params import MAX_REPORTED, SCHEMA_RELPATH, ParamsError, validate_params
from hnclip.config.registry import Registry
from hnclip.errors import close_names, did_you_mean

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "recipe": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"epochs": {"type": "integer"}, "lr": {"type": "number"},
                           "g_source": {"enum": ["live", "frozen"]}},
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
    assert message_of({"recipe": {"g_source": "stale"}}, schema_path) == \
        "params.yaml: recipe.g_source: 'stale' is not one of ['live', 'frozen']"


def test_misspelled_key_names_the_allowed_keys(schema_path):
    assert message_of({"recipe": {"lr_typo": 1}}, schema_path) == (
        "params.yaml: recipe: Additional properties are not allowed ('lr_typo' was unexpected), "
        "allowed keys: ['epochs', 'g_source', 'lr']")


def test_type_error_names_the_key(schema_path):
    assert message_of({"recipe": {"epochs": "ten"}}, schema_path) == \
        "params.yaml: recipe.epochs: 'ten' is not of type 'integer'"


def test_the_most_relevant_branch_of_an_any_of_is_reported(schema_path):
    # both branches fail at the same key; the one whose type matches says what a valid name is
    assert message_of({"backbone": "vit_h"}, schema_path) == \
        "params.yaml: backbone: 'vit_h' is not one of ['vit_b16', 'vit_l14']"


def test_several_errors_one_per_line_and_readable_as_one_line(schema_path):
    message = message_of({"recipe": {"epochs": "ten", "g_source": "stale"}, "seeds": [1, "two"]}, schema_path)
    lines = message.splitlines()
    assert len(lines) == 3 and lines[0].startswith("params.yaml: ")
    assert [line.removeprefix("params.yaml: ").rstrip(";") for line in lines] == [  # shallower keys first
        "recipe.epochs: 'ten' is not of type 'integer'",
        "recipe.g_source: 'stale' is not one of ['live', 'frozen']",
        "seeds.1: 'two' is not of type 'integer'",
    ]
    one_line = " ".join(message.split())  # what `hnclip` prints
    assert one_line.startswith("params.yaml: ") and one_line.count("params.yaml") == 1
    assert one_line.count("; ") == 2


def test_at_most_max_reported_errors_are_named(schema_path):
    seeds = ["x"] * (MAX_REPORTED + 3)
    lines = message_of({"seeds": seeds}, schema_path).splitlines()
    assert len(lines) == MAX_REPORTED + 1
    assert lines[-1] == "and 3 more problems not shown"
    assert [line.removeprefix("params.yaml: ").rstrip(";") for line in lines[:-1]] == \
        [f"seeds.{i}: 'x' is not of type 'integer'" for i in range(MAX_REPORTED)]


# ---- errors that teach ---------------------------------------------------------------------------

def test_close_names_suggest_the_clear_match_only():
    assert close_names("hn_clp", ["hn_clip", "hn_only", "tok_only", "hn_clip_128way"]) == ["hn_clip"]
    assert close_names("HN_CLIP", ["hn_clip", "goal"]) == ["hn_clip"]  # case is ignored
    assert close_names("huge", ["paper", "paper_rehearsal", "tiny", "tiny_seeds"]) == []
    # a suggestion naming every allowed value says nothing the list does not
    assert close_names("vit_h", ["vit_b16", "vit_l14"]) == []
    assert did_you_mean("long_dc", ["docci", "dci", "long_dci", "urban1k"]) == "; did you mean 'long_dci'?"
    assert did_you_mean(3, ["docci"]) == ""


def test_a_misspelt_enum_value_gets_the_closest_allowed_one(schema_path):
    assert message_of({"recipe": {"g_source": "frozn"}}, schema_path) == \
        "params.yaml: recipe.g_source: 'frozn' is not one of ['live', 'frozen']; did you mean 'frozen'?"


def test_a_misspelt_key_gets_the_closest_allowed_one_and_its_description(tmp_path):
    schema = {"type": "object", "additionalProperties": False, "properties": {
        "epochs": {"type": "integer", "description": "passes over the training set"},
        "lr": {"type": "number", "description": "the learning rate"}}}
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    assert message_of({"epoch": 3}, path) == (
        "params.yaml: <top level>: Additional properties are not allowed ('epoch' was unexpected), "
        "allowed keys: ['epochs', 'lr']; did you mean 'epochs'? (epochs: passes over the training set)")
    # the description of the key a type error, or a missing key, is about
    assert message_of({"epochs": "ten"}, path) == \
        "params.yaml: epochs: 'ten' is not of type 'integer' (epochs: passes over the training set)"
    schema["required"] = ["lr"]
    path.write_text(yaml.safe_dump(schema))
    assert message_of({}, path) == "params.yaml: <top level>: 'lr' is a required property (lr: the learning rate)"


def test_a_description_is_found_through_a_ref(tmp_path):
    schema = {"$defs": {"positive_int": {"type": "integer", "minimum": 1}},
              "type": "object", "properties": {"recipe": {"type": "object", "properties": {
                  "epochs": {"$ref": "#/$defs/positive_int", "description": "passes over the training set"}}}}}
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    assert message_of({"recipe": {"epochs": 0}}, path) == \
        "params.yaml: recipe.epochs: 0 is less than the minimum of 1 (epochs: passes over the training set)"


def test_every_key_of_the_project_schema_has_a_description(project_root):
    """A schema error explains the key it names: every key params.yaml may hold has a description."""
    from hnclip.config.params import _description
    root = yaml.safe_load((project_root / SCHEMA_RELPATH).read_text())
    missing = []

    def walk(node, path):
        if not isinstance(node, dict):
            return
        for keyword, value in node.items():
            if keyword == "properties":
                for name, sub in value.items():
                    if sub is not True and not _description(sub, root):
                        missing.append(f"{path}.{name}")
                    walk(sub, f"{path}.{name}")
            elif keyword in ("additionalProperties", "items", "then"):
                walk(value, f"{path}.*" if keyword == "additionalProperties" else path)
            elif keyword in ("allOf", "oneOf", "anyOf"):
                for sub in value:
                    walk(sub, path)

    walk(root, "")
    for name, definition in root["$defs"].items():
        walk(definition, f"$defs.{name}")
    assert not missing


def test_a_misspelt_method_key_names_the_key_it_may_mean(params, in_project):
    params["methods"]["hn_clip"]["lambda_tk"] = 1.0
    message = message_of(params, None)
    assert "methods.hn_clip: unknown key(s) ['lambda_tk']" in message
    assert "did you mean 'lambda_tok'?" in message
    assert "(lambda_tok: " in message  # what the key it may mean is


def test_a_schema_error_carries_the_key_description(params, in_project):
    params["profiles"]["paper"]["execution"]["device"] = "cuda0"
    message = message_of(params, None)
    assert message.startswith("params.yaml: profiles.paper.execution.device: 'cuda0' does not match")
    assert "(device: where jobs run: auto, cpu, cuda or cuda:N" in message


def registry_message(params) -> str:
    with pytest.raises(ParamsError) as error:
        Registry(params)
    return str(error.value)


def test_a_misspelt_method_in_a_table_names_the_row_and_the_method_it_may_mean(params, in_project):
    rows = params["tables"]["table1"]["rows"]
    i = next(i for i, row in enumerate(rows) if row["key"] == "hn_clip")
    rows[i]["method"] = "hn_clp"
    message = registry_message(params)
    assert message.startswith(f"params.yaml: tables.table1.rows.{i}.method: unknown method 'hn_clp' in row 'hn_clip'; "
                              "allowed values: ['dora', ")
    assert message.endswith("; did you mean 'hn_clip'?")


def test_every_broken_reference_is_reported_in_one_error(params, in_project):
    rows = params["tables"]["table1"]["rows"]
    i = next(i for i, row in enumerate(rows) if row["key"] == "hn_clip")
    rows[i]["method"] = "hn_clp"
    params["tables"]["table3a"]["benchmarks"].append("long_dc")
    params["methods"]["goal"]["settings"] = {"patch_size_bugs": False}
    params["figures"]["fig6_sample_efficiency"]["table"] = "tableA99"
    with pytest.raises(ParamsError) as error:
        Registry(params)
    lines = str(error.value).splitlines()
    assert len(lines) == len(error.value.problems) == 4
    assert lines[0].startswith("params.yaml: methods.goal.settings: unknown key(s) ['patch_size_bugs'] for the goal "
                               "framework; allowed keys: [")
    assert lines[0].endswith("; did you mean 'patch_size_bug'?;")
    assert lines[1].startswith(f"tables.table1.rows.{i}.method: unknown method 'hn_clp' in row 'hn_clip'")
    assert lines[2].startswith("tables.table3a.benchmarks.4: unknown benchmark 'long_dc'; allowed values: "
                               "['dci', 'docci', 'long_dci', 'urban1k']; did you mean 'long_dci'?")
    assert lines[3].startswith("figures.fig6_sample_efficiency.table: unknown table 'tableA99'")
    assert lines[3].endswith("did you mean 'tableA9'?")
    one_line = " ".join(str(error.value).split())  # what `hnclip` prints
    assert one_line.count("params.yaml") == 1 and one_line.count("; did you mean") == 4


def test_schema_errors_of_several_keys_are_reported_together(params, in_project):
    params["methods"]["hn_clip"]["lambda_tk"] = 1.0
    params["profiles"]["tiny"]["recipe"]["epochs"] = "ten"
    message = message_of(params, None)
    assert "methods.hn_clip: unknown key(s) ['lambda_tk']" in message
    assert "profiles.tiny.recipe.epochs: 'ten' is not of type 'integer' (epochs: " in message


# The allowed values come from the params file itself, so that adding a profile, benchmark, backbone or
# optional table leaves this test as it is.
@pytest.mark.parametrize("mutate, expected", [
    (lambda p: p.update(profile="tiny_seed"),
     lambda p: f"params.yaml: profile: unknown profile 'tiny_seed'; allowed values: {sorted(p['profiles'])}; "
               "did you mean 'tiny_seeds'?"),
    (lambda p: p["tables"]["table3a"]["benchmarks"].append("urban1"),
     lambda p: f"params.yaml: tables.table3a.benchmarks.{len(p['tables']['table3a']['benchmarks']) - 1}: unknown "
               f"benchmark 'urban1'; allowed values: {sorted(p['benchmarks'])}; did you mean 'urban1k'?"),
    (lambda p: p["profiles"]["tiny"].update(backbone="tiny_pretrain"),
     lambda p: f"params.yaml: profiles.tiny.backbone: unknown backbone 'tiny_pretrain'; allowed values: "
               f"{sorted(p['backbones'])}; did you mean 'tiny_pretrained'?"),
    (lambda p: p.update(optional_tables=["tablex1"]),
     lambda p: "params.yaml: optional_tables: ['tablex1'] are not optional tables; allowed values: "
               f"{sorted(name for name, table in p['tables'].items() if table.get('optional'))}; "
               "did you mean 'tableX1'?"),
    (lambda p: p["methods"]["hn_clip"].update(settings={"lr_schedule": "cosine"}),
     lambda p: "params.yaml: methods.hn_clip.settings: unknown key(s) ['lr_schedule'] for the full framework, "
               f"which has no settings; the frameworks with settings: {sorted(p['frameworks'])}"),
])
def test_an_unknown_name_gets_its_suggestion(params, in_project, mutate, expected):
    mutate(params)
    assert registry_message(params) == expected(params)


def test_the_cli_prints_every_problem_on_one_line(empty_project, params, capsys):
    from hnclip.cli import main
    params["profiles"]["tiny"]["recipe"]["epochs"] = "ten"
    params["methods"]["hn_clip"]["lambda_tk"] = 1.0
    (empty_project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["validate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: params.yaml: ")
    assert "did you mean 'lambda_tok'?" in err and "profiles.tiny.recipe.epochs: 'ten'" in err


def test_a_method_problem_is_reported_once_not_at_every_row_that_uses_it(params, in_project):
    params["methods"]["goal"]["recipe_overrides"] = {**params["methods"]["goal"].get("recipe_overrides", {}),
                                                     "exact_batch": True}
    message = registry_message(params)
    assert message.startswith("params.yaml: methods.goal: recipe_overrides.exact_batch is available for the "
                              "frameworks ['full', 'lora', 'dora'] only, not 'goal'")
    assert "\n" not in message and "rows" not in message


def test_a_key_renamed_for_one_meaning_per_word_names_its_new_name(params):
    """A params file written with a method's old key names (`margin: live`, `recipe:`) is told the new ones."""
    params["methods"]["hn_clip"]["margin"] = params["methods"]["hn_clip"].pop("g_source")
    params["methods"]["goal"]["recipe"] = params["methods"]["goal"].pop("recipe_overrides")
    message = message_of(params, None)
    assert "methods.hn_clip: unknown key(s) ['margin']" in message
    assert "'margin' is now called 'g_source' (g_source: " in message
    assert "methods.goal: unknown key(s) ['recipe']" in message
    assert "'recipe' is now called 'recipe_overrides' (recipe_overrides: " in message
    assert "did you mean 'margin_control'" not in message


def test_a_misspelt_key_and_a_misspelt_method_in_one_file_are_reported_together(empty_project, params, capsys):
    """The schema's errors and the broken references of one file come in one error: fixing the key does not
    meet the method name only on the next try."""
    from hnclip.cli import main
    table1 = params["tables"]["table1"]["rows"]
    row = next(i for i, r in enumerate(table1) if r["method"] == "hn_clip")
    table1[row]["method"] = "hn_clp"
    params["methods"]["hn_only"]["lambda_tk"] = params["methods"]["hn_only"].pop("lambda_tok")
    (empty_project / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["validate"]) == 2
    err = capsys.readouterr().err
    assert "methods.hn_only: unknown key(s) ['lambda_tk']" in err and "did you mean 'lambda_tok'?" in err
    assert (f"tables.table1.rows.{row}.method: unknown method 'hn_clp' in row 'hn_clip'; allowed values: "
            in err and "did you mean 'hn_clip'?" in err)
    with pytest.raises(ParamsError) as error:
        Registry(params)
    assert any("'hn_clp'" in p for p in error.value.problems) and any("'lambda_tk'" in p for p in error.value.problems)
