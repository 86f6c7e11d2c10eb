"""The cross-references of a params file, which the schema cannot see: every name it uses (a profile,
backbone, dataset, benchmark, method, table, framework setting) refers to something it defines, and the
HN-CLIP trainer's options sit on frameworks that read them. `reference_problems` names every broken
reference at once, each at its dotted key (a table row's with its key), with the allowed values and the
closest known names; the registry raises them together with the schema's errors."""
from __future__ import annotations

from hnclip.config.constants import TRAINED_FRAMEWORKS
from hnclip.config.objective_keys import misplaced_options
from hnclip.errors import did_you_mean, did_you_mean_each, unknown_name


def reference_problems(params: dict, profile_name: str | None, best_effort: bool = False) -> list[str]:
    """Every broken reference of `params` on profile `profile_name`, without repeats. `best_effort`: the
    schema refused the file, so read what its structure lets be read and give [] where the refused
    structure is what the checks would read (the schema's errors say what)."""
    try:
        profiles = params["profiles"]
        if profile_name not in profiles:
            return [] if best_effort and profile_name is None else \
                [unknown_name("profile", "profile", profile_name, profiles)]
        return list(dict.fromkeys(_problems(params, profile_name, profiles[profile_name])))
    except (KeyError, TypeError, AttributeError, IndexError, ValueError):
        if best_effort:
            return []
        raise


def trained_only_problems(where: str, method: dict) -> list[str]:
    """Table X1's controls (a margin control, one softmax over the accumulation group) are options of
    the HN-CLIP objective's trainer: a baseline framework would silently ignore them."""
    options = misplaced_options(method)
    options += ["recipe_overrides.exact_batch"] if method.get("recipe_overrides", {}).get("exact_batch") else []
    if options and method["framework"] not in TRAINED_FRAMEWORKS:
        return [f"{where}: {', '.join(options)} is available for the frameworks {list(TRAINED_FRAMEWORKS)} only, "
                f"not {method['framework']!r}"]
    return []


def _problems(p: dict, pname: str, prof: dict) -> list[str]:
    problems: list[str] = []
    if prof["backbone"] not in p["backbones"]:
        problems.append(unknown_name(f"profiles.{pname}.backbone", "backbone", prof["backbone"], p["backbones"]))
    for name, bench in p["benchmarks"].items():
        for role, key in ((bench["train"], "train"), (bench["test"]["dataset"], "test.dataset")):
            if role not in prof["datasets"]:
                problems.append(f"benchmarks.{name}.{key}: dataset {role!r} is not defined in profile {pname!r} "
                                f"(add it to profiles.{pname}.datasets); defined: {sorted(prof['datasets'])}")
    for mname, method in p["methods"].items():
        problems += _settings_problems(p, f"methods.{mname}.settings", method)
        problems += trained_only_problems(f"methods.{mname}", method)
    for tname, table in p["tables"].items():
        problems += _table_problems(p, tname, table)
    optional = sorted(name for name, table in p["tables"].items() if table.get("optional"))
    switch = p.get("optional_tables")
    # A profile may name a table a trimmed params file leaves out; the switch must name optional tables.
    for where, wrong in ((f"profiles.{pname}.optional_tables",
                          set(prof.get("optional_tables", [])) & (set(p["tables"]) - set(optional))),
                         ("optional_tables", set(switch if isinstance(switch, list) else []) - set(optional))):
        if wrong:
            problems.append(f"{where}: {sorted(wrong)} are not optional tables; allowed values: {optional}"
                            f"{did_you_mean_each(sorted(wrong), optional)}")
    for tname, table in p["derived_tables"].items():
        problems += _derived_table_problems(p, tname, table)
    for fname, figure in p.get("figures", {}).items():
        tables = [(f"figures.{fname}.table", figure.get("table"))] + \
            [(f"figures.{fname}.series.{i}.table", s["table"]) for i, s in enumerate(figure.get("series", []))]
        for where, table in tables:
            if table is not None and table not in p["tables"]:
                problems.append(unknown_name(where, "table", table, p["tables"]))
    return problems


def _table_problems(p: dict, tname: str, table: dict) -> list[str]:
    """A table's broken references: its benchmarks, its method (`vary`) or its rows' methods, benchmarks
    and settings, its probe rows."""
    at = f"tables.{tname}"
    problems = [unknown_name(f"{at}.benchmarks.{i}", "benchmark", bench, p["benchmarks"])
                for i, bench in enumerate(table["benchmarks"]) if bench not in p["benchmarks"]]
    if "method" in table and table["method"] not in p["methods"]:
        problems.append(unknown_name(at, "method", table["method"], p["methods"]))
    for i, row in enumerate(table.get("rows", [])):
        in_row = f" in row {row['key']!r}"
        if row["method"] not in p["methods"]:
            problems.append(unknown_name(f"{at}.rows.{i}.method", "method", row["method"], p["methods"], in_row))
        elif row.get("set"):   # what the row's own settings break (the method's own problems are its)
            method = {**p["methods"][row["method"]], **row["set"]}
            problems += _settings_problems(p, f"{at}.rows.{i}.set.settings", method, row["set"])
            if not trained_only_problems("", p["methods"][row["method"]]):
                problems += trained_only_problems(f"{at}.rows.{i} (row {row['key']!r})", method)
        for j, bench in enumerate(row.get("benchmarks", [])):
            if bench not in table["benchmarks"]:
                problems.append(f"{at}.rows.{i}.benchmarks.{j}: benchmark {bench!r}{in_row} is not one of the "
                                f"table's benchmarks {table['benchmarks']}"
                                f"{did_you_mean(bench, table['benchmarks'])}")
    keys = [row["key"] for row in table.get("rows", [])]
    missing = [row for row in table.get("probe_rows", []) if row not in keys]
    if missing:
        problems.append(f"{at}.probe_rows: {sorted(missing)} are not rows of the table; allowed values: {keys}"
                        f"{did_you_mean_each(sorted(missing), keys)}")
    return problems


def _settings_problems(p: dict, where: str, method: dict, own: dict | None = None) -> list[str]:
    """Keys of a method's `settings` (or of a row's `set: {settings: ...}`, `own`) that its framework's
    protocol settings (`frameworks.<framework>`) do not have."""
    settings = (method if own is None else own).get("settings", {})
    allowed = sorted(p["frameworks"].get(method["framework"], {}))
    unknown = sorted(set(settings) - set(allowed))
    if not unknown:
        return []
    if not allowed:
        return [f"{where}: unknown key(s) {unknown} for the {method['framework']} framework, which has no "
                f"settings; the frameworks with settings: {sorted(p['frameworks'])}"]
    return [f"{where}: unknown key(s) {unknown} for the {method['framework']} framework; allowed keys: "
            f"{allowed}{did_you_mean_each(unknown, allowed)}"]


def _derived_table_problems(p: dict, tname: str, table: dict) -> list[str]:
    at = f"derived_tables.{tname}"
    problems = []
    if tname in p["tables"]:
        problems.append(f"{at}: the name is also a table of `tables`; rename one of them")
    for i, row in enumerate(table.get("rows", [])):
        if row["method"] not in p["methods"]:
            problems.append(unknown_name(f"{at}.rows.{i}.method", "method", row["method"], p["methods"],
                                         f" in row {row['key']!r}"))
    if table["kind"] == "timing" and not ("train" in table and table.get("rows")):
        missing = [key for key in ("train", "rows") if not table.get(key)]
        problems.append(f"{at}: a timing table needs `train` (the training set of the runs it times) and `rows` "
                        f"(the methods it times); missing: {missing}")
    return problems
