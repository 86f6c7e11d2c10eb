"""params.yaml -> content-addressed RunSpecs, and which runs and evaluations each table cell needs.

A run is identified by everything that determines its trained weights (data realisation, init,
objective, recipe, seed, training fraction) and nothing else: the method's label, the table that
asks for it and execution settings (device, threads) are not part of it. Two cells asking for the
same experiment therefore resolve to the same run id and are trained once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hnclip.config import paths
from hnclip.config.constants import (
    ADAPTER_FRAMEWORKS,
    AUXILIARY_INPUTS,
    BASELINE_FRAMEWORKS,
    COST_ONLY_SETTINGS,
    DEFAULT_ADAPTER,
    PRETRAIN_ROLE,
    RUNNABLE_FRAMEWORKS,
)
from hnclip.config.objective_keys import ZEROSHOT_FRAMEWORK, readable_parts, run_objective
from hnclip.config.params import ParamsError, params_error, validate_params
from hnclip.config.references import reference_problems
from hnclip.errors import UnknownNameError
from hnclip.hashing import canonical_json, json_sha256

# The objective's keys, their defaults and which of them identify a run: hnclip.config.objective_keys.
# Every framework of params.yaml is trained here (RUNNABLE_FRAMEWORKS, the machinery baselines included)
# but `none`, which is evaluated as released (zero-shot). A cell whose framework the trainer cannot run
# would have no run and the status NOT_IMPLEMENTED.
ZEROSHOT = ZEROSHOT_FRAMEWORK
NOT_IMPLEMENTED = "not implemented yet"
GRADIENT_FIGURE_KINDS = {"gradient_dynamics", "gradient_dynamics_grid"}  # drawn from grad_probe.jsonl


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    spec: dict = field(compare=False, hash=False)
    spec_hash: str = ""

    @property
    def train_set(self) -> str:
        return self.spec["train_set"]

    def canonical(self) -> str:
        return canonical_json(self.spec)


@dataclass(frozen=True)
class Cell:
    table: str
    row: str
    benchmark: str
    seed: int
    run_id: str | None          # None when the row's framework is not implemented yet
    train_set: str | None = None
    method: str = ""
    settings: tuple = ()        # the row's resolved method settings, as sorted (key, value) pairs

    @property
    def status(self) -> str:
        return "ok" if self.run_id else NOT_IMPLEMENTED


def method_recipe(recipe: dict, method: dict) -> dict:
    """The profile's recipe with a method's own settings: its learning-rate multipliers (PEFT
    adapters train at 25x the full fine-tuning rate, 5e-5 vs 2e-6 in the paper; FineLIP's backbone
    at 0.5x and its cross-modal module at 100x; GOAL and StructXLIP at 2.5x), its overrides of the
    recipe (`recipe_overrides`: e.g. weight decay) and its adapter shape: the run's training recipe (a
    spec's `recipe`). Absent settings add no key, so other runs keep their identity. `compute_batch` is an
    execution choice: never in a run's recipe."""
    base_lr = recipe["lr"]
    # compute_batch is an execution choice; a null max_logit_scale is the default (unclamped): neither
    # is part of a run's identity, so naming them in params.yaml changes no run id
    recipe = {key: value for key, value in recipe.items()
              if key != "compute_batch" and not (key == "max_logit_scale" and value is None)}
    recipe.update(method.get("recipe_overrides", {}))
    if method.get("lr_scale", 1.0) != 1.0:
        recipe["lr"] = base_lr * method["lr_scale"]
    if "module_lr_scale" in method:
        recipe["module_lr"] = base_lr * method["module_lr_scale"]
    if method["framework"] in ADAPTER_FRAMEWORKS:
        recipe["adapter"] = {**DEFAULT_ADAPTER, **method.get("adapter", {})}
    return recipe


def pretrain_dataset(pretrain: dict) -> dict:
    """The synthetic corpus a backbone is pretrained on, as a dataset realisation."""
    dataset = {"kind": "synthetic", "variant": pretrain["variant"], "sizes": pretrain["sizes"],
               "seed": pretrain["data_seed"]}
    return {**dataset, "generator": pretrain["generator"]} if "generator" in pretrain else dataset


def with_generator_digest(dataset: dict) -> dict:
    if dataset["kind"] != "synthetic":
        return dataset
    from hnclip.config.synthetic_spec import dataset_fingerprint
    digest = dataset_fingerprint(dataset["variant"], dataset["sizes"], dataset["seed"],
                                 generator=dataset.get("generator"))["digest"]
    return {**dataset, "generator_digest": digest}

def pretrain_spec(reg: "Registry", name: str) -> dict:
    """A backbone pretrained here is a run of its own: its spec (and so its id) from the backbone's `pretrain`."""
    backbone = reg.backbone_spec(name)
    pre = backbone["pretrain"]
    return {
        "train_set": PRETRAIN_ROLE,
        "dataset": with_generator_digest(pretrain_dataset(pre)),
        "fraction": 1.0, "seed": pre["seed"],
        "init": {"backbone": "scratch", "model_config": backbone["model_config"]},
        # `margin`: the G source by its identity name (hnclip.config.objective_keys), as every run spec has it
        "objective": {"framework": "full", "gamma": 0.0, "lambda_tok": 0.0, "margin": "live"},
        "recipe": {"epochs": pre["epochs"], "micro_batch": pre["batch_size"], "grad_accum": 1, "lr": pre["lr"],
                   "weight_decay": pre["weight_decay"], "warmup_steps": pre["warmup_steps"],
                   "reset_logit_scale": None, "precision": "fp32"},
    }


def _fmt(value: float) -> str:
    return f"{value:g}"


def make_run_id(spec: dict) -> tuple[str, str]:
    """The run id: a readable part, then the first 8 hex digits of the spec's hash (`digest`, returned too).
    The readable part shows the training set, the objective (each key it holds in its short form, declared
    in hnclip.config.objective_keys: `docci-lora-g0.5-tok0-live-constant-…`), `exact` for one softmax
    over the accumulation group, the fraction and the seed."""
    digest = json_sha256(spec)
    batch = ["exact"] if spec["recipe"].get("exact_batch") else []
    readable = "-".join([spec["train_set"], *readable_parts(spec["objective"]), *batch,
                         f"f{_fmt(spec['fraction'])}", f"s{spec['seed']}"])
    return f"{readable}-{digest[:8]}", digest


class Registry:
    def __init__(self, params: dict, profile: str | None = None, validate: bool = True,
                 schema_path: str | Path | None = None):
        problems = []
        if validate:
            try:
                validate_params(params, schema_path)
            except ParamsError as error:
                problems = list(error.problems) or [str(error)]
        self.params = params
        self.profile_name = profile or (params.get("profile") if isinstance(params, dict) else None)
        # with the schema's errors, the broken references the file also has: every problem in one error
        problems += reference_problems(params, self.profile_name, best_effort=bool(problems))
        if problems:
            raise params_error(problems)
        self.profile = params["profiles"][self.profile_name]
        self._runs: dict[str, RunSpec] = {}
        self._costs: dict[str, dict] = {}   # run id -> its method's cost-only settings (COST_ONLY_SETTINGS)
        # Tables marked `optional` are planned only where asked for (`is_planned`).
        self._cells: dict[str, list[Cell]] = {name: self._expand_table(name) for name in params["tables"]
                                              if self.is_planned(name)}

    def is_planned(self, table: str) -> bool:
        """Whether this profile plans a table of `tables`: every table not marked `optional`; an optional
        one when the profile's own `optional_tables` lists it (the embedded profiles plan Table X1's
        controls) or the `optional_tables` switch asks for it (`true`: every optional table; a list:
        those, e.g. `--config 'optional_tables=[tableX1]'`)."""
        if not self.params["tables"][table].get("optional"):
            return True
        switch = self.params.get("optional_tables", False)
        return switch is True or table in self.profile.get("optional_tables", []) or \
            (isinstance(switch, list) and table in switch)

    def figure_tables(self, name: str) -> list[str]:
        """Tables whose cells a figure draws (none for the caption-geometry figures)."""
        figure = self.params["figures"][name]
        tables = [figure["table"]] if "table" in figure else [s["table"] for s in figure.get("series", [])]
        return list(dict.fromkeys(tables))

    def figure_series(self, figure: dict) -> dict[str, list[Cell]]:
        """A figure's (its params.yaml entry's) curves: label -> the implemented cells it draws.
        Curves come from `series: [{table, row, label}]`, else from its table's `rows` (default:
        every row), restricted to its `benchmark` if it names one; a row of a framework not
        implemented yet has no curve."""
        if "series" in figure:
            items = figure["series"]
        elif "table" in figure:
            rows = figure.get("rows") or list(dict.fromkeys(c.row for c in self.cells(figure["table"])))
            items = [{"table": figure["table"], "row": row} for row in rows]
        else:
            items = []
        series = {}
        for item in items:
            cells = [c for c in self.cells(item["table"]) if c.row == item["row"] and c.run_id
                     and c.benchmark == figure.get("benchmark", c.benchmark)]
            if cells:
                series[item.get("label", item["row"])] = cells
        return series

    def figure_cells(self, figure: dict) -> list[Cell]:
        return [c for cells in self.figure_series(figure).values() for c in cells]

    @functools.cached_property
    def _probed_runs(self) -> set[str]:
        """Runs the gradient-dynamics figures draw and the runs of a table's `probe_rows` (Table X1's
        exact-zero gradients, fp32 vs bf16): the readers of the gradient probe."""
        drawn = {c.run_id for figure in self.params.get("figures", {}).values()
                 if figure["kind"] in GRADIENT_FIGURE_KINDS for c in self.figure_cells(figure)}
        return drawn | {c.run_id for name in self.tables for c in self.probe_cells(name)}

    def probe_cells(self, table: str) -> list[Cell]:
        """The implemented cells of a table's `probe_rows` (whose runs' probe logs it reports), one per run."""
        rows = self.params["tables"][table].get("probe_rows", [])
        cells = {c.run_id: c for c in self.cells(table) if c.row in rows and c.run_id}
        return list(cells.values())

    def probe_every(self, run_id: str) -> int:
        """Optimizer steps between gradient probes of a run (0: not probed). `grad_probe_runs:
        figures` probes only the runs the gradient-dynamics figures draw: the probe costs two extra
        backward passes per probed step, and no other artifact reads it."""
        execution = self.profile["execution"]
        every = int(execution.get("grad_probe_every", 0) or 0)
        if execution.get("grad_probe_runs", "figures") == "all":
            return every
        return every if run_id in self._probed_runs else 0

    def timed_runs(self, table: str | None = None) -> dict[str, str | None]:
        """A timing table's rows -> the planned run (on its training set, first seed) whose training
        record gives its time; None for frameworks not implemented and for runs no table asks for. An
        `optional` row is listed only when an optional table the profile plans trains its run."""
        spec = self.params["derived_tables"][table or self.derived_table("timing")]
        out = {}
        for row in spec["rows"]:
            method = self.params["methods"][row["method"]]
            run_id = None
            if method["framework"] in RUNNABLE_FRAMEWORKS:
                run = self.run_spec(spec["train"], method, self.profile["seeds"][0], register=False)
                run_id = run.run_id if run.run_id in self._runs else None
            if run_id or not row.get("optional"):
                out[row["key"]] = run_id
        return out

    def paired_timing(self) -> dict | None:
        """{table, rounds, warmup, runs: {row: run id}} of the timing table's `paired_timing` (the timing
        claims' measurement, hnclip.commands.step_timing): its rows' planned runs, its rounds and warmup (the
        profile's `timing_rounds` overrides them); None where the table declares none or fewer than two of its
        rows are planned."""
        table = self.derived_table("timing")
        spec = self.params["derived_tables"][table]
        if "paired_timing" not in spec:
            return None
        keys = {row["key"] for row in spec["rows"]}
        unknown = sorted(set(spec["paired_timing"]["rows"]) - keys)
        if unknown:
            raise UnknownNameError(f"params.yaml: derived_tables.{table}.paired_timing.rows: unknown row(s) "
                                   f"{unknown}; allowed values: {sorted(keys)}")
        timed = self.timed_runs(table)
        runs = {row: timed[row] for row in spec["paired_timing"]["rows"] if timed.get(row)}
        if len(runs) < 2:
            return None
        counts = {key: spec["paired_timing"][key] for key in ("rounds", "warmup")}
        counts |= self.profile.get("timing_rounds", {})
        return {"table": table, **counts, "runs": runs}

    def released_costs(self, run_id: str) -> dict[str, bool]:
        """The cost-only operations of a baseline's released code (GOAL: a second forward of both towers,
        autograd anomaly detection) that this run executes. They change no weight, only time, so they
        are not part of the run's identity: with `execution.released_costs: timed` (the default) only
        the runs the timing table (A3) measures pay them, as the paper's official runs did; `all`: every
        run of a method that asks for them."""
        costs = self._costs.get(run_id, {})
        if self.profile["execution"].get("released_costs", "timed") == "all":
            return dict(costs)
        timed = run_id in self.timed_runs().values()
        return {key: bool(value) and timed for key, value in costs.items()}

    # ---- expansion -----------------------------------------------------------------------------
    def dataset_spec(self, role: str) -> dict:
        """A dataset role's realisation; generated data also carry the generator's digest, so a
        change of the generator's code is a change of every run trained on its output."""
        return with_generator_digest(self.profile["datasets"][role])

    def backbone_name(self) -> str:
        return self.profile["backbone"]

    def backbone_spec(self, name: str | None = None) -> dict:
        return self.params["backbones"][name or self.backbone_name()]

    def init_spec(self) -> dict:
        """What a run starts from: the backbone's spec (and its pretraining data's digest)."""
        spec = {"backbone": self.backbone_name(), **self.backbone_spec()}
        if "pretrain" in spec:
            spec["pretrain_data"] = with_generator_digest(pretrain_dataset(spec["pretrain"]))["generator_digest"]
        return spec

    def run_spec(self, train_set: str, method: dict, seed: int, fraction: float = 1.0,
                 register: bool = True) -> RunSpec:
        """The run of these settings; `register=False` only computes its identity (planned runs are
        exactly those the tables ask for: nothing else may add to them)."""
        spec = {
            "train_set": train_set,
            "dataset": self.dataset_spec(train_set),
            "fraction": float(fraction),
            "seed": int(seed),
            "init": self.init_spec(),
            "objective": run_objective(method),
            "recipe": method_recipe(self.profile["recipe"], method),
        }
        framework = method["framework"]
        costs = {}
        if framework in BASELINE_FRAMEWORKS:  # its protocol settings and the auxiliary inputs it reads
            settings = {**self.params["frameworks"][framework], **method.get("settings", {})}
            costs = {key: settings.pop(key) for key in COST_ONLY_SETTINGS.get(framework, ()) if key in settings}
            spec["objective"]["settings"] = settings
            aux = self.profile.get("auxiliary", {})
            spec["auxiliary"] = {name: aux.get(name) for name in AUXILIARY_INPUTS.get(framework, ())}
        run_id, digest = make_run_id(spec)
        if not register:
            return self._runs.get(run_id, RunSpec(run_id, spec, digest))
        self._costs.setdefault(run_id, costs)
        return self._runs.setdefault(run_id, RunSpec(run_id, spec, digest))

    def zeroshot_id(self) -> str:
        """The pseudo-run of the initial backbone evaluated as released (no training)."""
        digest = json_sha256(self.init_spec())
        return f"zeroshot-{self.backbone_name()}-{digest[:8]}"

    def _table_rows(self, name: str) -> list[dict]:
        """Each row of a table as {key, method, settings (the method's dict with the row's own settings), train,
        benchmarks, seeds}."""
        table, methods = self.params["tables"][name], self.params["methods"]
        seeds = self.table_seeds(name)
        if "vary" in table:
            (knob, values), = table["vary"].items()
            return [{"key": f"{knob}={_fmt(value)}", "method": table["method"],
                     "settings": {**methods[table["method"]], knob: value}, "train": None,
                     "benchmarks": table["benchmarks"], "seeds": seeds} for value in values]
        return [{"key": row["key"], "method": row["method"],
                 "settings": {**methods[row["method"]], **row.get("set", {})},
                 "train": row.get("train"), "benchmarks": row.get("benchmarks", table["benchmarks"]),
                 "seeds": [row["seed"]] if "seed" in row else seeds} for row in table["rows"]]

    def table_seeds(self, table: str) -> list[int]:
        """Seeds of a table's cells under this profile (`table_seeds` overrides the profile's `seeds`)."""
        return self.profile.get("table_seeds", {}).get(table, self.profile["seeds"])

    def _cell_run(self, method: dict, train_set: str, seed: int) -> str | None:
        if method["framework"] == ZEROSHOT:
            return self.zeroshot_id()
        if method["framework"] not in RUNNABLE_FRAMEWORKS:
            return None
        return self.run_spec(train_set, method, seed, method.get("fraction", 1.0)).run_id

    def _expand_table(self, name: str) -> list[Cell]:
        cells = []
        for row in self._table_rows(name):
            zeroshot = row["settings"]["framework"] == ZEROSHOT
            for bench in row["benchmarks"]:
                train_set = row["train"] or self.params["benchmarks"][bench]["train"]
                for seed in row["seeds"][:1] if zeroshot else row["seeds"]:  # nothing to seed without training
                    run_id = self._cell_run(row["settings"], train_set, seed)
                    cells.append(Cell(name, row["key"], bench, seed, run_id, None if zeroshot else train_set,
                                      row["method"], tuple(sorted(row["settings"].items()))))
        return cells

    # ---- queries -------------------------------------------------------------------------------
    def derived_table(self, kind: str) -> str:
        """The name of params.yaml's derived table of this kind (caption_geometry, timing)."""
        names = [name for name, spec in self.params["derived_tables"].items() if spec["kind"] == kind]
        if len(names) != 1:
            raise ParamsError(f"params.yaml: derived_tables must declare exactly one table of kind {kind!r}, "
                              f"found {names}")
        return names[0]

    @property
    def tables(self) -> list[str]:
        return list(self._cells)

    def cells(self, table: str) -> list[Cell]:
        if table not in self._cells:
            raise UnknownNameError(f"unknown table {table!r}; allowed values: {self.tables}")
        return self._cells[table]

    def runs(self) -> dict[str, RunSpec]:
        return dict(self._runs)

    def run(self, run_id: str) -> RunSpec:
        if run_id not in self._runs:
            raise UnknownNameError(f"unknown run {run_id!r} for profile {self.profile_name!r} "
                           f"(params.yaml changed since it was planned?)")
        return self._runs[run_id]

    def evaluations(self, tables: list[str] | None = None) -> list[tuple[str, str]]:
        pairs = {(c.run_id, c.benchmark) for t in (tables or self.tables) for c in self.cells(t) if c.run_id}
        return sorted(pairs)

    def auxiliary_inputs(self, run_id: str) -> dict:
        """kind -> JSONL index of the auxiliary inputs a run trains on (GOAL, StructXLIP), else {}."""
        run = self.run(run_id)
        kinds = AUXILIARY_INPUTS.get(run.spec["objective"]["framework"], ())
        return {kind: paths.auxiliary_index(self.profile["data_root"], run.train_set, kind) for kind in kinds}

    def auxiliary_builds(self) -> list[tuple[str, str]]:
        """(training set, kind) of every auxiliary input a planned run needs."""
        needed = {(run.train_set, kind) for run in self.runs().values()
                  for kind in AUXILIARY_INPUTS.get(run.spec["objective"]["framework"], ())}
        return sorted(needed)

    def is_zeroshot(self, run_id: str) -> bool:
        return run_id == self.zeroshot_id()

    def eval_benchmarks(self, train_set: str) -> list[str]:
        """Benchmarks evaluated after every epoch of a run on `train_set` (its in-domain tests)."""
        return [name for name, b in self.params["benchmarks"].items() if b["train"] == train_set]

    def test_manifest(self, benchmark: str):
        if benchmark not in self.params["benchmarks"]:
            raise UnknownNameError(f"unknown benchmark {benchmark!r}; "
                                   f"allowed values: {sorted(self.params['benchmarks'])}")
        test = self.params["benchmarks"][benchmark]["test"]
        return paths.manifest(self.profile["data_root"], test["dataset"], test["split"])

    def train_manifest(self, train_set: str):
        if train_set not in self.profile["datasets"]:
            raise UnknownNameError(f"unknown dataset {train_set!r}; allowed values: {sorted(self.profile['datasets'])}")
        return paths.manifest(self.profile["data_root"], train_set, "train")

    def used_datasets(self) -> list[str]:
        roles = set()
        for bench in self.params["benchmarks"].values():
            roles.update((bench["train"], bench["test"]["dataset"]))
        return sorted(roles & set(self.profile["datasets"]))

    def dataset_splits(self, role: str) -> list[str]:
        """Manifests the pipeline needs from a dataset role (train if any benchmark trains on it; tests)."""
        splits = set()
        for bench in self.params["benchmarks"].values():
            if bench["train"] == role:
                splits.add("train")
            if bench["test"]["dataset"] == role:
                splits.add(bench["test"]["split"])
        return sorted(splits)

    def summary(self) -> dict[str, Any]:
        return {"profile": self.profile_name, "unique_runs": len(self._runs),
                "evaluations": len(self.evaluations()),
                "cells": {t: len(c) for t, c in self._cells.items()},
                "cells_not_implemented": sum(c.run_id is None for cells in self._cells.values() for c in cells)}
