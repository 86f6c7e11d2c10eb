"""Load params.yaml and validate it against workflow/schemas/params.schema.yaml.

Errors name the offending key (as a dotted path), what is wrong with it, the allowed values where
the schema lists them, the closest known names of a misspelt name or key ("did you mean ...?") and the
key's `description` from the schema, so a malformed registry fails before any job starts with a message
that says how to fix it. Every problem of a file is reported at once (up to MAX_REPORTED, then how many
more), the schema's here and the cross-references' (hnclip.config.registry) likewise.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema.exceptions import best_match

from hnclip.errors import UserError, close_names, did_you_mean, did_you_mean_each

SCHEMA_RELPATH = Path("workflow/schemas/params.schema.yaml")
MAX_REPORTED = 10  # problems named in one ParamsError (then: how many more)
# libyaml's loader where PyYAML has it: the same documents, about 6x faster than the pure-Python one,
# and every job of the workflow reads params.yaml and its schema once.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str):
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader


class ParamsError(UserError, ValueError):
    """params.yaml is malformed; the message names the key and what is allowed. `problems`: each problem
    found, all of them (the message names the first MAX_REPORTED)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems) if problems else [message]

    def __reduce__(self):  # pickled whole (a job's error crosses processes), its problems included
        return type(self), (str(self), self.problems)


def params_error(problems: list[str], source: str = "params.yaml") -> ParamsError:
    """One ParamsError for every problem of a params file: one per line, separated by "; " so that the
    CLI's one-line form stays readable; the first MAX_REPORTED, then how many more there are."""
    lines = problems[:MAX_REPORTED]
    if len(problems) > MAX_REPORTED:
        more = len(problems) - MAX_REPORTED
        lines = [*lines, f"and {more} more {'problem' if more == 1 else 'problems'} not shown"]
    return ParamsError(f"{source}: " + ";\n".join(lines), problems)


def find_project_root(start: str | Path | None = None) -> Path:
    here = Path(start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / SCHEMA_RELPATH).is_file():
            return candidate
    raise ParamsError(f"no {SCHEMA_RELPATH} found above {here}; run hnclip from the project root")


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "<top level>"


def _resolve(schema: dict, root: dict) -> dict:
    """A schema with its local `$ref` followed."""
    seen = 0
    while isinstance(schema, dict) and str(schema.get("$ref", "")).startswith("#/") and seen < 20:
        target = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        schema, seen = target, seen + 1
    return schema


def _declared_properties(schema: dict, root: dict) -> dict[str, dict]:
    """The keys an object schema declares, with their schemas: its own `properties` and those of the
    schemas it refers to (a local `$ref`) or combines (`allOf`, and their `then`), which
    `unevaluatedProperties` counts as known."""
    if not isinstance(schema, dict):
        return {}
    declared: dict[str, dict] = {}
    if str(schema.get("$ref", "")).startswith("#/"):
        declared.update(_declared_properties(_resolve({"$ref": schema["$ref"]}, root), root))
    for part in schema.get("allOf", []):
        declared.update(_declared_properties(part, root))
        declared.update(_declared_properties(part.get("then", {}), root))
    declared.update(schema.get("properties", {}))
    return declared


def _description(schema: object, root: dict) -> str | None:
    """A schema's `description`, or that of the schema its `$ref` names."""
    while isinstance(schema, dict):
        if isinstance(schema.get("description"), str):
            return " ".join(schema["description"].split())
        if not str(schema.get("$ref", "")).startswith("#/"):
            return None
        schema = _resolve({"$ref": schema["$ref"]}, root)
    return None


# Keywords whose value is a map of names to schemas (the next step of a schema path is a name), or a list
# of schemas (the next step is an index); those after which the schema applies to a member of the instance
# (a property's value or an item), so that the next key of the instance's path is reached.
_NAMED = {"properties", "patternProperties", "$defs", "dependentSchemas"}
_LISTED = {"allOf", "anyOf", "oneOf", "prefixItems"}
_TO_MEMBER = {"properties", "patternProperties", "prefixItems", "items", "additionalProperties",
              "unevaluatedProperties", "unevaluatedItems", "contains"}


def _holds(schema: object, keyword: str, member: object) -> bool:
    """Whether a schema has `keyword` (and, for a map or a list of schemas, its `member`)."""
    if not isinstance(schema, dict) or keyword not in schema:
        return False
    inner = schema[keyword]
    if member is None:
        return True
    if isinstance(inner, dict):
        return member in inner
    return isinstance(member, int) and isinstance(inner, list) and 0 <= member < len(inner)


def _error_key(error: jsonschema.ValidationError, root: dict) -> tuple[str | None, str | None, object]:
    """(name, description, schema) of the key an error is about: the schema path walked from the root
    (following the `$ref`s the validator followed) to the schema holding the failing keyword; the
    description is the innermost one met since the last key of the instance's path (an item of a list
    without a description of its own keeps the list's)."""
    path = list(error.absolute_path)
    node: object = root
    name: str | None = None
    description: str | None = None
    reached = 0   # keys of the instance's path reached so far
    steps = list(error.absolute_schema_path)[:-1]   # the last step is the failing keyword itself
    i = 0
    while i < len(steps):
        keyword = steps[i]
        member = steps[i + 1] if keyword in _NAMED | _LISTED and i + 1 < len(steps) else None
        # the validator does not record a `$ref` it follows: the next step is in the schema it names
        while not _holds(node, keyword, member) and isinstance(node, dict) and "$ref" in node:
            node = _resolve({"$ref": node["$ref"]}, root)
            description = description or _description(node, root)
        if not _holds(node, keyword, member):
            return name, description, node
        node = node[keyword]
        if member is not None:
            i += 1
            node = node[member]
        if keyword in _TO_MEMBER:
            key = path[reached] if reached < len(path) else steps[i]
            reached += 1
            own = _description(node, root)
            if own or keyword in ("properties", "patternProperties"):
                name, description = str(key), own
        else:
            description = description or _description(node, root)
        i += 1
    return name, description, node


def _explained(name: str | None, description: str | None) -> str:
    return f" ({name}: {description})" if name and description else ""


# A method's keys renamed so that each word means one thing (docs/pipeline.md's glossary): a params file
# written before the rename is told the new name rather than a guess.
RENAMED_KEYS = {"margin": "g_source", "recipe": "recipe_overrides"}


def _unknown_keys(error: jsonschema.ValidationError, schema: object, root: dict) -> str:
    """The misspelt keys of an object closed by `additionalProperties: false` or `unevaluatedProperties:
    false`: the allowed keys, the closest of them to each unknown one and what that one means."""
    declared = _declared_properties(schema if isinstance(schema, dict) else {}, root)
    known = sorted(declared)
    unknown = sorted(key for key in error.instance if key not in declared)
    if error.validator == "unevaluatedProperties":
        text = f"unknown key(s) {unknown}, allowed keys: {known}"
    else:
        text = f"{error.message}, allowed keys: {known}"
    renamed = {key: RENAMED_KEYS[key] for key in unknown if RENAMED_KEYS.get(key) in declared}
    text += "".join(f"; {key!r} is now called {new!r}" for key, new in renamed.items())
    unknown = [key for key in unknown if key not in renamed]
    guesses = list(dict.fromkeys([*renamed.values(), *(guess for key in unknown for guess in close_names(key, known))]))
    meanings = [f"{guess}: {_description(declared[guess], root)}" for guess in guesses
                if _description(declared[guess], root)]
    return text + did_you_mean_each(unknown, known) + (f" ({'; '.join(meanings)})" if meanings else "")


def _allowed_values(error: jsonschema.ValidationError) -> str:
    schema = error.schema if isinstance(error.schema, dict) else {}
    if "enum" in schema:
        return f", allowed values: {schema['enum']}"
    if "const" in schema:
        return f", allowed value: {schema['const']!r}"
    if error.validator == "propertyNames" and "enum" in schema.get("propertyNames", {}):
        return f", allowed keys: {schema['propertyNames']['enum']}"
    return ""


def _describe(error: jsonschema.ValidationError, root: dict) -> str:
    """One schema error as "<dotted key>: <what is wrong>, <what is allowed>; did you mean ...? (<key>:
    <its description>)"."""
    # best_match descends into oneOf/anyOf sub-errors to the one that most likely names the mistake
    error = best_match([error])
    try:
        name, description, schema = _error_key(error, root)
    except (KeyError, IndexError, TypeError, ValueError):   # a schema shape not foreseen: the error without them
        name, description, schema = None, None, error.schema
    if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(error.instance, dict) \
            and error.validator_value is False:   # a closed object: a misspelt or misplaced key
        return f"{_key_path(error)}: {_unknown_keys(error, schema, root)}"
    if error.validator == "required" and isinstance(error.instance, dict):   # what the missing key is for
        declared = _declared_properties(schema if isinstance(schema, dict) else {}, root)
        missing = [key for key in error.validator_value if key not in error.instance and repr(key) in error.message]
        if missing and missing[0] in declared:
            name, description = missing[0], _description(declared[missing[0]], root)
    allowed = _allowed_values(error)
    if allowed and allowed.split(": ", 1)[1] in error.message:
        allowed = ""  # jsonschema's own message already lists them
    guess = ""
    if error.validator == "enum" and isinstance(error.validator_value, list):
        guess = did_you_mean(error.instance, error.validator_value)
    return f"{_key_path(error)}: {error.message}{allowed}{guess}{_explained(name, description)}"


def validate_params(params: Any, schema_path: str | Path | None = None) -> None:
    """Raise ParamsError naming every schema error (up to MAX_REPORTED, then how many more), one per line
    and separated by "; " so that the CLI's one-line form stays readable; shallower keys first (as
    best_match ranks them), then in the schema's order."""
    schema_path = Path(schema_path) if schema_path else find_project_root() / SCHEMA_RELPATH
    schema = read_yaml(schema_path.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(params), key=lambda e: len(e.path))
    if errors:
        raise params_error([_describe(error, schema) for error in errors])


def schema_path(params_path: str | Path = "params.yaml") -> Path:
    """The schema of a params file: workflow/schemas/params.schema.yaml of the project it is in."""
    return find_project_root(Path(params_path).parent) / SCHEMA_RELPATH


def load_params(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None,
                validate: bool = True) -> dict:
    """Read, apply dotted-key overrides (e.g. {"profile": "paper"}), validate (unless the caller's
    Registry does, which also reports the broken references with the schema's errors), return the dict."""
    path = Path(path)
    try:
        params = read_yaml(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path} not found") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path} is not valid YAML: {exc}") from None
    params = apply_overrides(params, overrides or {})
    if validate:
        validate_params(params, schema_path(path))
    return params


def apply_overrides(params: dict, overrides: dict[str, Any]) -> dict:
    params = copy.deepcopy(params)
    for dotted, value in overrides.items():
        node = params
        *parents, leaf = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise ParamsError(f"override {dotted!r}: {key!r} is not a mapping in params.yaml")
            node = node[key]
        node[leaf] = value
    return params
