"""Load params.yaml and validate it against workflow/schemas/params.schema.yaml.

Errors name the offending key (as a dotted path) and, where the schema lists them, the allowed
values, so a malformed registry fails before any job starts.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from jsonschema.exceptions import best_match

from hnclip.errors import UserError

SCHEMA_RELPATH = Path("workflow/schemas/params.schema.yaml")
MAX_REPORTED = 10  # schema errors named in one ParamsError
# libyaml's loader where PyYAML has it: the same documents, about 6x faster than the pure-Python one,
# and every job of the workflow reads params.yaml and its schema once.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(text: str):
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader


class ParamsError(UserError, ValueError):
    """params.yaml is malformed; the message names the key and what is allowed."""


def find_project_root(start: str | Path | None = None) -> Path:
    here = Path(start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / SCHEMA_RELPATH).is_file():
            return candidate
    raise ParamsError(f"no {SCHEMA_RELPATH} found above {here}; run hnclip from the project root")


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "<top level>"


def _declared_keys(schema: dict, root: dict) -> list[str]:
    """The keys an object schema declares: its own `properties` and those of the schemas it refers to
    (a local `$ref`) or combines (`allOf`), which `unevaluatedProperties` counts as known."""
    keys = list(schema.get("properties", {}))
    if schema.get("$ref", "").startswith("#/"):
        target = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part]
        keys += _declared_keys(target, root)
    for part in schema.get("allOf", []):
        keys += _declared_keys(part, root)
    return sorted(set(keys))


def _allowed_values(error: jsonschema.ValidationError) -> str:
    schema = error.schema if isinstance(error.schema, dict) else {}
    if "enum" in schema:
        return f", allowed values: {schema['enum']}"
    if "const" in schema:
        return f", allowed value: {schema['const']!r}"
    if error.validator == "additionalProperties" and "properties" in schema:
        return f", allowed keys: {sorted(schema['properties'])}"
    if error.validator == "propertyNames" and "enum" in schema.get("propertyNames", {}):
        return f", allowed keys: {schema['propertyNames']['enum']}"
    return ""


def _describe(error: jsonschema.ValidationError, root: dict) -> str:
    # best_match descends into oneOf/anyOf sub-errors to the one that most likely names the mistake
    error = best_match([error])
    if error.validator == "unevaluatedProperties":  # a closed object made of several schemas
        known = _declared_keys(error.schema, root)
        return f"{_key_path(error)}: unknown key(s) {sorted(set(error.instance) - set(known))}, allowed keys: {known}"
    allowed = _allowed_values(error)
    if allowed and allowed.split(": ", 1)[1] in error.message:
        allowed = ""  # jsonschema's own message already lists them
    return f"{_key_path(error)}: {error.message}{allowed}"


def validate_params(params: Any, schema_path: str | Path | None = None) -> None:
    """Raise ParamsError naming up to MAX_REPORTED schema errors, one per line and separated by "; " so
    that the CLI's one-line form stays readable; shallower keys first (as best_match ranks them), then
    in the schema's order."""
    schema_path = Path(schema_path) if schema_path else find_project_root() / SCHEMA_RELPATH
    schema = read_yaml(schema_path.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(params), key=lambda e: len(e.path))
    if errors:
        lines = [_describe(error, schema) for error in errors[:MAX_REPORTED]]
        if len(errors) > MAX_REPORTED:
            lines.append(f"and {len(errors) - MAX_REPORTED} more")
        raise ParamsError("params.yaml: " + ";\n".join(lines))


def load_params(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> dict:
    """Read, apply dotted-key overrides (e.g. {"profile": "paper"}), validate, return the dict."""
    path = Path(path)
    try:
        params = read_yaml(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path} not found") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path} is not valid YAML: {exc}") from None
    params = apply_overrides(params, overrides or {})
    validate_params(params, find_project_root(path.parent) / SCHEMA_RELPATH)
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
