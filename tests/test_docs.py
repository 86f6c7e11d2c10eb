"""The user documentation (README.md and docs/*.md) stays true to the repository: every relative link
names a file (and heading) that exists, every command-line example of `hnclip`, Snakemake or DVC uses
verbs and flags the tool accepts (hnclip: its own argparse parser; Snakemake, DVC: their `--help`), the
profile and table names those examples use exist in params.yaml, and repository paths named in code
exist. The checkers are plain functions, also fed broken text below to show they catch it."""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import functools
import importlib
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

from hnclip.cli import build_parser
from hnclip.config.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOOLS = ("hnclip", "snakemake", "dvc")
# Repository paths named in code are checked when they start here (outputs such as results/ are not
# in a fresh clone, so they are not checked).
CHECKED_ROOTS = ("src/", "workflow/", "scripts/", "benchmarks/", "tests/", "docs/", ".ci/", ".dvc/")
CHECKED_FILES = {"params.yaml", "dvc.yaml", "Snakefile", "setup.sh", "requirements.lock", "requirements-npu.txt",
                 "pyproject.toml", ".dvcignore", "README.md"}
SHELL_FENCES = {"bash", "sh", "shell", "console"}


# ---- reading Markdown ----------------------------------------------------------------------------
def _fenced_and_prose(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(fenced code lines with their fence's info string, prose lines with `code spans` kept)."""
    code, prose, fence, info = [], [], None, ""
    for line in text.splitlines():
        marker = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if marker and fence is None:
            fence, info = marker.group(1), marker.group(2).lower()
        elif marker and line.strip().startswith(fence) and not marker.group(2):
            fence = None
        elif fence is not None:
            code.append((info, line))
        else:
            prose.append(line)
    return code, prose


def _paragraphs(prose: list[str]) -> list[str]:
    """Prose split at blank lines: code spans and links may wrap over lines, never over paragraphs."""
    return [block for block in "\n".join(prose).split("\n\n") if block.strip()]


def _code_spans(paragraph: str) -> list[str]:
    return [" ".join(span.split()) for _, span in re.findall(r"(`+)(.+?)\1", paragraph, re.S)]


def _without_code_spans(paragraph: str) -> str:
    return re.sub(r"(`+)(.+?)\1", "", paragraph, flags=re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"(`+)(.+?)\1", r"\2", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    for line in _fenced_and_prose(text)[1]:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_anchor(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen[f"{slug}-{count}"] = 1
    return set(seen)


# ---- links -----------------------------------------------------------------------------------------
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def link_problems(text: str, source: Path, root: Path = ROOT) -> list[str]:
    """Every relative link (and image) of `text`, read as the file `source`, must name an existing file
    inside `root`, and an existing heading where it names one (`file.md#heading`)."""
    problems = []
    for paragraph in _paragraphs(_fenced_and_prose(text)[1]):
        for target in LINK.findall(_without_code_spans(paragraph)):
            if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, mailto:, …
                continue
            path, _, anchor = target.partition("#")
            if not path:  # an anchor of this page
                if anchor not in anchors(text):
                    problems.append(f"link {target!r}: no heading with anchor #{anchor}")
                continue
            dest = (source.parent / unquote(path)).resolve()
            if not dest.is_relative_to(root.resolve()):
                problems.append(f"link {target!r} points outside the repository")
            elif not dest.exists():
                problems.append(f"link {target!r}: {dest.relative_to(root.resolve())} does not exist")
            elif anchor and dest.suffix == ".md":
                if anchor not in anchors(dest.read_text(encoding="utf-8")):
                    problems.append(f"link {target!r}: no heading with anchor #{anchor}")
    return problems


# ---- command-line examples -------------------------------------------------------------------------
def command_examples(text: str) -> list[str]:
    """Shell lines of ```bash blocks (continuations joined) and every inline code span."""
    code, prose = _fenced_and_prose(text)
    examples, pending = [], ""
    for info, line in code:
        if info not in SHELL_FENCES:
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        examples.append(pending.strip())
        pending = ""
    examples += [span for paragraph in _paragraphs(prose) for span in _code_spans(paragraph)]
    return [example for example in examples if example]


def _words(command: str) -> list[str] | None:
    """Shell words, operators (&&, |, ;) as words of their own, comments dropped; None if unparsable."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


def invocations(command: str) -> list[tuple[str, list[str]]]:
    """(tool, arguments) of each `hnclip`/`snakemake`/`dvc` call in a shell line (also `-m hnclip`)."""
    words = _words(command)
    if words is None:
        return []
    found, segment = [], []
    for word in [*words, ";"]:
        if word and set(word) <= set("|&;()"):
            while segment and re.match(r"^[A-Za-z_]\w*=", segment[0]):  # VAR=value before the command
                segment.pop(0)
            if segment and segment[0] in {tool for name in TOOLS for tool in (name, f".venv/bin/{name}")}:
                found.append((segment[0].rsplit("/", 1)[-1], segment[1:]))
            elif "-m" in segment[:-1] and segment[segment.index("-m") + 1] == "hnclip":
                found.append(("hnclip", segment[segment.index("-m") + 2:]))
            segment = []
        else:
            segment.append(word)
    return found


def _placeholder(word: str) -> bool:
    return bool(re.search(r"<[^>]*>|…|\.\.\.", word))


def _option(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not re.match(r"^-\d", word)


@functools.cache
def _params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def _name_problems(kind: str, name: str) -> list[str]:
    """A profile or table named in an example must exist in params.yaml."""
    if _placeholder(name):
        return []
    known = _params()["profiles"] if kind == "profile" else {**_params()["tables"], **_params()["derived_tables"]}
    return [] if name in known else [f"unknown {kind} {name!r} (params.yaml has {', '.join(sorted(known))})"]


def hnclip_problems(args: list[str], parser: argparse.ArgumentParser | None = None) -> list[str]:
    """Walk `args` through hnclip's parser: verbs, option flags (exact, no abbreviations), positional
    choices, and the profile and table names it takes. Missing required arguments are not problems: a
    page may name a verb alone."""
    parser = parser or build_parser()
    problems, positionals, i = [], [a for a in parser._actions if not a.option_strings], 0
    while i < len(args):
        word = args[i]
        if word == "--":
            break
        if _option(word):
            flag, has_value = word.split("=", 1)[0], "=" in word
            action = parser._option_string_actions.get(flag)
            if action is None:
                problems.append(f"{parser.prog}: unknown option {flag}")
                i += 1
                continue
            if action.help == argparse.SUPPRESS:  # a hidden alias kept for old scripts: pages use the current name
                problems.append(f"{parser.prog}: deprecated option {flag}")
            value = word.split("=", 1)[1] if has_value else (args[i + 1] if i + 1 < len(args) else "")
            if action.dest == "profile":
                problems += _name_problems("profile", value)
            if action.dest == "table":
                problems += _name_problems("table", value)
            i += 1 if (action.nargs == 0 or has_value) else 2
            continue
        if not positionals:
            problems.append(f"{parser.prog}: unexpected argument {word!r}")
            break
        action = positionals.pop(0)
        if isinstance(action, argparse._SubParsersAction):
            if _placeholder(word):
                break
            if word not in action.choices:
                problems.append(f"{parser.prog}: unknown verb {word!r}")
                break
            return problems + hnclip_problems(args[i + 1:], action.choices[word])
        if action.choices and not _placeholder(word) and word not in action.choices:
            problems.append(f"{parser.prog}: {word!r} is not one of {sorted(action.choices)}")
        if action.dest == "table":
            problems += _name_problems("table", word)
        i += 1
    return problems


def _executable(tool: str) -> str:
    found = shutil.which(tool, path=str(Path(sys.executable).parent)) or shutil.which(tool)
    if found is None:
        pytest.fail(f"{tool} is not installed: it is pinned in requirements.lock (run ./setup.sh)")
    return found


@functools.cache
def help_text(tool: str, *subcommands: str) -> str:
    """What `<tool> [subcommands] --help` prints, once per test session. DVC's comes from its own
    argparse parser (the text `--help` prints) rather than a process per subcommand."""
    if tool == "dvc":
        from dvc.cli.parser import get_main_parser

        parser = get_main_parser()
        for name in subcommands:
            choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
            parser = choices[name]
        return parser.format_help()
    result = subprocess.run([_executable(tool), *subcommands, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"{tool} {' '.join(subcommands)} --help failed:\n{result.stderr[-2000:]}"
    return result.stdout


def help_flags(text: str) -> set[str]:
    """Option flags of a --help text: those in the usage block and at the start of option lines."""
    flags, in_usage = set(), False
    for line in text.splitlines():
        in_usage = line.startswith("usage:") or (in_usage and bool(line.strip()))
        if in_usage or re.match(r"^ {1,8}-", line):
            flags.update(re.findall(r"(?<![\w-])(--?[A-Za-z0-9][\w-]*)", line))
    return flags


def help_subcommands(text: str) -> set[str]:
    """Subcommand names of an argparse --help text: `{a,b}` in the usage, or an indented command list."""
    usage = text.split("\n\n", 1)[0]
    names = {name for group in re.findall(r"\{([\w,-]+)\}", usage) for name in group.split(",")}
    listing = re.search(r"Available Commands:\n(.*?)(?:\n\S|\Z)", text, re.S)
    if listing:
        for name, alias in re.findall(r"^ {4}([a-z][\w-]*)(?:\s+\(([\w-]+)\))?", listing.group(1), re.M):
            names.update({name, alias} - {""})
    return names


def snakemake_problems(args: list[str]) -> list[str]:
    problems, known = [], help_flags(help_text("snakemake"))
    for i, word in enumerate(args):
        if _option(word) and word.split("=", 1)[0] not in known:
            problems.append(f"snakemake: unknown option {word.split('=', 1)[0]}")
        if word == "--config":
            for setting in args[i + 1:]:
                if _option(setting):
                    break
                key, _, value = setting.partition("=")
                if key == "profile":
                    problems += _name_problems("profile", value)
                elif key not in _params():
                    problems.append(f"snakemake --config {key}: not a top-level key of params.yaml")
    return problems


def dvc_problems(args: list[str]) -> list[str]:
    """Descend through DVC's subcommands while its help lists some, then check the flags there."""
    path, flags, descending = [], [], True
    for word in args:
        if _option(word):
            flags.append(word.split("=", 1)[0])
            continue
        if not descending:
            continue
        subcommands = help_subcommands(help_text("dvc", *path))
        if not subcommands or _placeholder(word):
            descending = False
        elif word not in subcommands:
            return [f"{' '.join(['dvc', *path])}: unknown command {word!r}"]
        else:
            path.append(word)
    known = help_flags(help_text("dvc", *path))
    return [f"{' '.join(['dvc', *path])}: unknown option {flag}" for flag in flags if flag not in known]


CHECKERS = {"hnclip": hnclip_problems, "snakemake": snakemake_problems, "dvc": dvc_problems}


def _expand_braces(word: str) -> list[str]:
    match = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if not match:
        return [word]
    return [expanded for choice in match.group(1).split(",")
            for expanded in _expand_braces(word[:match.start()] + choice + word[match.end():])]


def path_problems(example: str, root: Path = ROOT) -> list[str]:
    """Repository paths named in an example (source, workflow, scripts, …) must exist."""
    problems = []
    for word in (_words(example) or example.split()):
        for candidate in _expand_braces(word.rstrip(".,:;")):
            if _placeholder(candidate) or re.search(r"[*?$\[\]]", candidate):
                continue
            if candidate.startswith(CHECKED_ROOTS) or candidate in CHECKED_FILES:
                if not (root / candidate).exists():
                    problems.append(f"{candidate} does not exist")
    return problems


def command_problems(text: str, root: Path = ROOT) -> list[str]:
    """Every command-line example of `text`: tool verbs and flags, names, and repository paths."""
    problems = []
    for example in command_examples(text):
        found = invocations(example)
        if not found and re.match(rf"^(\.venv/bin/)?({'|'.join(TOOLS)})\s", example) and _words(example) is None:
            problems.append(f"{example!r}: not a parsable shell line")
        for tool, args in found:
            problems += [f"{example!r}: {problem}" for problem in CHECKERS[tool](args)]
        problems += [f"{example!r}: {problem}" for problem in path_problems(example, root)]
    return problems


# ---- the documentation as committed -----------------------------------------------------------------
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_existing_files_and_headings(doc: Path):
    assert link_problems(doc.read_text(encoding="utf-8"), doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_command_examples_use_verbs_flags_names_and_paths_that_exist(doc: Path):
    assert command_problems(doc.read_text(encoding="utf-8")) == []


def test_readme_shows_the_two_commands_verbatim_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shell_lines = {line.strip() for info, line in _fenced_and_prose(readme)[0] if info in SHELL_FENCES}
    ci_command = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci_command == "./setup.sh && .venv/bin/python -m pytest -q -n auto --dist loadfile"
    assert {"./setup.sh && .venv/bin/dvc repro", ci_command} <= shell_lines


def test_readme_is_short_and_maps_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    linked = {(ROOT / target).resolve() for target in LINK.findall(readme)}
    assert {page.resolve() for page in DOCS[1:]} <= linked


def test_no_issue_numbers_or_development_history_in_user_docs():
    pattern = re.compile(r"[Ii]ssue ?#?[0-9]+|\bsession\b")
    hits = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()}" for doc in DOCS
            for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_the_readme_figure_is_drawn_from_its_csv(tmp_path):
    """scripts/docs_figure.py renders the committed CSV (the numbers docs/results.md reports)."""
    spec = importlib.util.spec_from_file_location("docs_figure", ROOT / "scripts" / "docs_figure.py")
    docs_figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_figure)
    out = tmp_path / "figure.png"
    assert docs_figure.main(["--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line.split(",") for line in (ROOT / "docs" / "table1_excerpt.csv").read_text(encoding="utf-8")
            .splitlines() if line and not line.startswith("#")][1:]
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for method, *values in rows:
        pairs = " | ".join(f"{a} / {b}" for a, b in zip(values[::2], values[1::2]))
        assert f"| {method} | {pairs} |" in results, method


# ---- run counts ------------------------------------------------------------------------------------------
@functools.cache
def planned_runs(profile: str, optional_tables: tuple[str, ...] | None = None) -> int:
    """How many training runs the registry plans for a profile (with these optional tables instead of the
    profile's own, where given)."""
    params = copy.deepcopy(_params())
    if optional_tables is not None:
        params["profiles"][profile]["optional_tables"] = list(optional_tables)
    return len(Registry(params, profile, validate=False).runs())


@functools.cache
def planned_runs_of(profile: str, *frameworks: str) -> int:
    """How many of a profile's planned training runs train one of these frameworks."""
    runs = Registry(copy.deepcopy(_params()), profile, validate=False).runs().values()
    return sum(run.spec["objective"]["framework"] in frameworks for run in runs)


@functools.cache
def planned_evaluations(profile: str) -> int:
    """How many evaluation jobs (run x benchmark, zero-shot included) the registry plans for a profile."""
    return len(Registry(copy.deepcopy(_params()), profile, validate=False).evaluations())


# Every count of planned training runs (and evaluations) that a page states, as (page, a pattern around the
# count, the registry's count): a page that says another number fails here, and one that rewords the
# sentence must keep a pattern here that reads it.
RUN_COUNTS = [
    ("README.md", r"fine-tunes\s+the\s+(\d+)\s+runs", lambda: planned_runs("tiny")),
    ("README.md", r"\| `tiny` \(default\) \|[^|\n]*\| (\d+) \|", lambda: planned_runs("tiny")),
    ("README.md", r"\| `tiny_seeds` \|[^|\n]*\| (\d+) more \|",
     lambda: planned_runs("tiny_seeds") - planned_runs("tiny")),
    ("README.md", r"\| `paper` \|[^|\n]*\| (\d+) \|", lambda: planned_runs("paper")),
    ("README.md", r"\| `paper_rehearsal` \|[^|\n]*\| (\d+) \|", lambda: planned_runs("paper_rehearsal")),
    ("docs/controls.md", r"(\d+)\s+runs\s+more\s+than\s+the\s+paper's",
     lambda: planned_runs("tiny") - planned_runs("paper")),
    ("docs/controls.md", r"more\s+than\s+the\s+paper's\s+(\d+)\)", lambda: planned_runs("paper")),
    ("docs/controls.md", r"stays\s+the\s+paper's\s+(\d+)\s+runs", lambda: planned_runs("paper")),
    ("docs/profiles.md", r"\| `tiny` \(default\) \|[^\n]*?\| (\d+) \|", lambda: planned_runs("tiny")),
    ("docs/profiles.md", r"`tiny`'s (\d+) \+", lambda: planned_runs("tiny")),
    ("docs/profiles.md", r"`tiny`'s \d+ \+ (\d+) second-seed runs",
     lambda: planned_runs("tiny_seeds") - planned_runs("tiny")),
    ("docs/profiles.md", r"\| the paper's (\d+) \|", lambda: planned_runs("paper")),
    ("docs/profiles.md", r"\[tableX1\]`,\s+(\d+)\s+runs", lambda: planned_runs("tiny") - planned_runs("tiny", ())),
    ("docs/rehearsal.md", r"the\s+same\s+(\d+)\s+training\s+runs", lambda: planned_runs("paper_rehearsal")),
    ("docs/rehearsal.md", r"all\s+(\d+)\s+runs\s+were\s+trained", lambda: planned_runs("paper_rehearsal")),
    ("docs/rehearsal.md", r"training\s+runs,\s+(\d+)\s+evaluations", lambda: planned_evaluations("paper_rehearsal")),
    ("docs/paper-run.md", r"trains\s+the\s+(\d+)\s+training\s+runs", lambda: planned_runs("paper")),
    ("docs/paper-run.md", r"with\s+these:\s+the\s+(\d+)\s+training\s+runs", lambda: planned_runs("paper")),
    ("docs/profiles.md", r"every\s+one\s+of\s+the\s+(\d+)\s+runs", lambda: planned_runs("tiny")),
    ("docs/scale-out.md", r"computes\s+\(the\s+(\d+)\s+training\s+runs", lambda: planned_runs("paper")),
    # what the commands cost: the jobs the default profile plans
    ("docs/results.md", r"`tiny`:\s+(\d+)\s+unique\s+training\s+runs", lambda: planned_runs("tiny")),
    ("docs/results.md", r"\(the\s+paper's\s+(\d+):", lambda: planned_runs("paper")),
    ("docs/results.md", r"Table\s+X1's\s+(\d+)\s+controls\)", lambda: planned_runs("tiny") - planned_runs("tiny", ())),
    ("docs/results.md", r"controls\),\s+(\d+)\s+evaluations", lambda: planned_evaluations("tiny")),
    ("docs/results.md", r"plans\s+the\s+paper's\s+(\d+)\s+runs", lambda: planned_runs("paper")),
    # the pasted `hnclip plan` excerpt and the GPU-memory table by framework
    ("docs/paper-run.md", r"\n  train\s+(\d+) jobs", lambda: planned_runs("paper")),
    ("docs/paper-run.md", r"\n  evaluate\s+(\d+) jobs", lambda: planned_evaluations("paper")),
    ("docs/paper-run.md", r"run outputs \((\d+) x model\.pt", lambda: planned_runs("paper")),
    ("docs/paper-run.md", r"\| `full` \([^|\n]*\) \| (\d+) \|", lambda: planned_runs_of("paper", "full")),
    ("docs/paper-run.md", r"\| `lora`, `dora` \| (\d+) \|", lambda: planned_runs_of("paper", "lora", "dora")),
    ("docs/paper-run.md", r"\| `finelip` \| (\d+) \|", lambda: planned_runs_of("paper", "finelip")),
    ("docs/paper-run.md", r"\| `goal` \| (\d+) \|", lambda: planned_runs_of("paper", "goal")),
    ("docs/paper-run.md", r"\| `structxlip` \| (\d+) \|", lambda: planned_runs_of("paper", "structxlip")),
]


@pytest.mark.parametrize("page, pattern, count", RUN_COUNTS, ids=[f"{p}:{q}" for p, q, _ in RUN_COUNTS])
def test_stated_run_counts_are_the_registrys(page, pattern, count):
    stated = re.findall(pattern, (ROOT / page).read_text(encoding="utf-8"))
    assert stated, f"{page} no longer matches {pattern!r}: state the count so that this test can read it"
    assert {int(number) for number in stated} == {count()}, \
        f"{page} states {sorted(set(stated))} where the registry plans {count()} ({pattern!r})"


# ---- the checkers catch what they should --------------------------------------------------------------
def test_link_checker_flags_missing_files_headings_and_escapes(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## Scale-out: GPUs\n")
    good = "See [other](other.md), [its section](other.md#scale-out-gpus), [top](#title) and [web](https://x.org).\n"
    assert link_problems(f"# Title\n\n{good}", page, tmp_path) == []
    broken = ("# Title\n[gone, over\ntwo lines](missing.md) ![img](figure.png) [bad anchor](other.md#nowhere) "
              "[out](../../etc/passwd) `[not a link](nope.md)`\n```\n[in code](nope.md)\n```\n")
    problems = link_problems(broken, page, tmp_path)
    assert len(problems) == 4, problems
    assert any("missing.md" in p for p in problems) and any("figure.png" in p for p in problems)
    assert any("#nowhere" in p for p in problems) and any("outside" in p for p in problems)


def test_hnclip_checker_flags_unknown_verbs_flags_choices_and_names():
    good = ("```bash\n.venv/bin/hnclip --profile tiny_seeds cell table3a --benchmark docci --set gamma=0.25 -n\n"
            "torchrun --nproc_per_node 8 -m hnclip --profile paper train --run-id <run-id>\n```\n"
            "`hnclip <verb>` and `hnclip lineage` and `hnclip auxiliary edges --dataset vg`\n")
    assert command_problems(good) == []
    for broken, expected in [
            ("```bash\n.venv/bin/hnclip frobnicate --table table1\n```", "unknown verb 'frobnicate'"),
            ("`hnclip cell table3a --datset docci`", "hnclip cell: unknown option --datset"),
            ("`hnclip cell table3a --dataset docci`", "hnclip cell: deprecated option --dataset"),
            ("`hnclip runs --tab table1`", "hnclip runs: unknown option --tab"),  # no abbreviations
            ("`hnclip lineage t.csv --profile tiny --cell x`", "hnclip lineage: unknown option --profile"),
            ("`hnclip auxiliary masks --dataset docci`", "'masks' is not one of ['edges', 'segments', 'shard-count']"),
            ("`hnclip --profile huge validate`", "unknown profile 'huge'"),
            ("`hnclip table table99`", "unknown table 'table99'"),
            ("`python -m hnclip train --epochs 3`", "hnclip train: unknown option --epochs"),
            ("a span that wraps: `hnclip cell table3a\n--datset docci` here", "unknown option --datset")]:
        problems = command_problems(broken)
        assert any(expected in problem for problem in problems), (broken, problems)


def test_snakemake_and_dvc_checkers_flag_unknown_options_commands_and_config():
    good = ("```bash\n.venv/bin/snakemake --workflow-profile workflow/profiles/default --config profile=paper "
            "'optional_tables=[tableX1]' -n\n.venv/bin/dvc exp run --set-param 'a.b=1' && .venv/bin/dvc metrics diff\n"
            "```\n`dvc add data/real/<source>/raw`, `dvc repro`\n")
    assert command_problems(good) == []
    for broken, expected in [
            ("`snakemake --workflow-profil workflow/profiles/default`", "snakemake: unknown option --workflow-profil"),
            ("`snakemake --config profile=huge`", "unknown profile 'huge'"),
            ("`snakemake --config no_such_key=1`", "no_such_key: not a top-level key of params.yaml"),
            ("`dvc metrics shwo`", "dvc metrics: unknown command 'shwo'"),
            ("`dvc frobnicate`", "dvc: unknown command 'frobnicate'"),
            ("`.venv/bin/dvc exp run --set-params x=1`", "dvc exp run: unknown option --set-params")]:
        problems = command_problems(broken)
        assert any(expected in problem for problem in problems), (broken, problems)


def test_path_checker_flags_missing_repository_paths_only():
    assert path_problems("python3 scripts/local_slurm.py start && cat src/hnclip/losses/{goal,finelip}.py") == []
    assert path_problems("results/tables/table1.csv data/<root>/x benchmarks/results/*.jsonl") == []
    assert path_problems("python3 scripts/no_such_script.py") == ["scripts/no_such_script.py does not exist"]
    assert path_problems("src/hnclip/losses/{goal,nope}.py") == ["src/hnclip/losses/nope.py does not exist"]


# ---- source paths and module names the pages name ------------------------------------------------------
SOURCE_ROOT = ROOT / "src" / "hnclip"
SOURCE_PATH = re.compile(r"(?<![\w/.-])src/hnclip/[\w/.{},-]*[\w}]")
MODULE_NAME = re.compile(r"(?<![\w/.-])hnclip(?:\.\w+)+")
FILE_SUFFIXES = {"sif", "sh", "log", "txt", "json", "yaml", "tar", "gz", "zip", "out"}


def _top_level_names(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def module_problem(dotted: str, package_root: Path = SOURCE_ROOT) -> str | None:
    """None when `dotted` is a module of the package, or a name one defines (`hnclip.losses.objective.global_logits`;
    a package's lazily exported name counts when its __init__ names it)."""
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        base = package_root.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if cut == 0:
            module = package_root / "__init__.py"
        if not module.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if rest[0] in _top_level_names(module) or (module.name == "__init__.py" and
                                                   re.search(rf"\b{rest[0]}\b", module.read_text(encoding="utf-8"))):
            return None
        return f"{dotted}: {'.'.join(['hnclip', *parts[:cut]])} defines no {rest[0]!r}"
    return f"{dotted}: no such module"


def source_name_problems(text: str, root: Path = ROOT) -> list[str]:
    """Every `src/hnclip/...` path and `hnclip.x.y` module (or name in one) a page names, in prose or code."""
    problems = []
    for word in SOURCE_PATH.findall(text):
        for candidate in _expand_braces(word):
            if not _placeholder(candidate) and not re.search(r"[*?$<>]", candidate) and not (root / candidate).exists():
                problems.append(f"{candidate} does not exist")
    for dotted in MODULE_NAME.findall(text):
        if dotted.rsplit(".", 1)[-1] in FILE_SUFFIXES:  # a file name (`hnclip.sif`), not a module
            continue
        problem = module_problem(dotted.rstrip("."), root / "src" / "hnclip")
        if problem:
            problems.append(problem)
    return sorted(set(problems))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_source_paths_and_modules_named_in_the_docs_exist(doc: Path):
    assert source_name_problems(doc.read_text(encoding="utf-8")) == []


def test_the_source_name_checker_flags_moved_modules_and_missing_names():
    good = ("`src/hnclip/claims/tie.py`, src/hnclip/losses/{goal,finelip}.py, `hnclip.claims.scorecard`, "
            "`hnclip.losses.objective.global_logits`, `python -m hnclip.runtime.warm`, hnclip.losses.")
    assert source_name_problems(good) == []
    assert source_name_problems("`src/hnclip/report/tie.py` and hnclip.steps.train, hnclip.report.claims_verdicts; "
                                "`hnclip.losses.objective.no_such_function`") == [
        "hnclip.losses.objective.no_such_function: hnclip.losses.objective defines no 'no_such_function'",
        "hnclip.report.claims_verdicts: hnclip.report defines no 'claims_verdicts'",
        "hnclip.steps.train: hnclip defines no 'steps'",
        "src/hnclip/report/tie.py does not exist"]


# ---- docs/pipeline.md: the source layout and the verb table are the package's and the CLI's ------------
PIPELINE = ROOT / "docs" / "pipeline.md"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def layout_entries(text: str) -> dict[str, str]:
    """The source layout block of pipeline.md: each `src/hnclip/` entry (`training/`, `cli.py`, …) -> its text."""
    block = _section(text, "Source layout").split("```")[1]
    entries, current = {}, None
    for line in block.splitlines():
        entry = re.match(r"^  (\S+)\s", line + " ")
        if entry:
            current = entry.group(1)
            entries[current] = line
        elif line.startswith("   ") and current:
            entries[current] += "\n" + line
        else:
            current = None
    return entries


def test_the_source_layout_names_every_package_and_module():
    entries = layout_entries(PIPELINE.read_text(encoding="utf-8"))
    listed_top = " ".join(entry for name, entry in entries.items() if not name.endswith("/"))
    missing = []
    for path in sorted(SOURCE_ROOT.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            entry = entries.get(f"{path.name}/")
            if entry is None:
                missing.append(f"{path.name}/")
                continue
            modules = [p.stem for p in path.glob("*.py") if p.stem not in ("__init__", "__main__")]
            data = [p.name for p in path.iterdir() if p.suffix in (".yaml", ".json")]
            missing += [f"{path.name}/{name}" for name in modules + data
                        if not re.search(rf"(?<![\w.]){re.escape(name)}\b", entry)]
        elif path.suffix == ".py" and path.name != "__init__.py" and path.name not in listed_top:
            missing.append(path.name)
    assert missing == []


def test_the_verb_table_has_every_verb_and_every_command_module():
    table = _section(PIPELINE.read_text(encoding="utf-8"), "The `hnclip` command")
    rows = [line for line in table.splitlines() if line.startswith("| `hnclip ")]
    verbs = {verb for row in rows for verb in re.findall(r"`hnclip ([\w-]+)`", row.split(" | ")[0])}
    modules = {module for row in rows for module in re.findall(r"`(\w+)\.py`", row.split(" | ")[1])}
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert verbs == set(subcommands)
    assert modules == {p.stem for p in (SOURCE_ROOT / "commands").glob("*.py")} - {"__init__"}
    for row in rows:  # the module a verb's row names is the one the CLI imports for it
        for verb in re.findall(r"`hnclip ([\w-]+)`", row.split(" | ")[0]):
            for module in re.findall(r"`(\w+)\.py`", row.split(" | ")[1]):
                assert re.search(rf"hnclip\.commands(\.{module}\b| import {module}\b)", _cli_source_of(verb)), \
                    (verb, module)


def _cli_source_of(verb: str) -> str:
    """The source of the CLI's function for one verb (its `set_defaults(func=...)` target)."""
    import hnclip.cli as cli
    source = Path(cli.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    handler = build_parser()._subparsers._group_actions[0].choices[verb].get_default("func")
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == handler.__name__)
    return ast.get_source_segment(source, function)


# ---- docs/pipeline.md: tracing one cell ----------------------------------------------------------------
TRACE_LIMIT = 8  # files a reader may need to follow one cell from params.yaml to its loss and its table code


def traced_files(text: str = "") -> tuple[int, list[tuple[int, str, str]]]:
    """(the count the section states, [(item number, file, item text)]) of pipeline.md's "Tracing one cell"."""
    section = _section(text or PIPELINE.read_text(encoding="utf-8"), "Tracing one cell")
    stated = int(re.search(r"opens these (\d+) files", section).group(1))
    items = re.findall(r"^(\d+)\. `([^`]+)`(.*(?:\n {3,}\S.*)*)", section, re.M)
    return stated, [(int(number), path, " ".join(rest.split())) for number, path, rest in items]


def _python_module(path: str) -> str | None:
    return ".".join(["hnclip", *Path(path).relative_to("src/hnclip").with_suffix("").parts]) \
        if path.startswith("src/hnclip/") and path.endswith(".py") else None


def _function_source(path: Path, name: str) -> str:
    source = path.read_text(encoding="utf-8")
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node)


def recorded_code_names() -> dict[str, str]:
    """The code names the records of the traced cell hold, computed as their writers compute them: a run's
    train.json (`loop.run_code`: the loop, the loss function of its batch mode, the recall function), the
    evaluation record (`commands.evaluate`: the selection rule) and the table's record (`report.build`: its
    builder and the function that reads its cells)."""
    from types import SimpleNamespace

    import hnclip.commands.evaluate as evaluate
    from hnclip.provenance import code_name
    from hnclip.report import build, tables
    from hnclip.training import loop
    from hnclip.training.methods import build_method
    method = build_method("full", {"framework": "full", "gamma": 0.25, "lambda_tok": 1.0}, {}, None,
                          SimpleNamespace(batch=None), {}, None)
    run = SimpleNamespace(mode="micro", method=method)
    return {**{f"train.json {role}": name for role, name in loop.run_code(run).items()},
            "train.json loss_terms (compute mode)": code_name(loop.loss_function("compute", method)),
            "evaluation selection": code_name(evaluate.select_epochs),
            "table written_by": code_name(build.build_table), "table cells": code_name(tables.collect)}


def test_the_cell_trace_lists_existing_files_each_reached_from_an_earlier_one():
    stated, items = traced_files()
    assert [number for number, _, _ in items] == list(range(1, stated + 1))
    files = [path for _, path, _ in items]
    assert len(set(files)) == len(files)
    assert [path for path in files if not (ROOT / path).is_file()] == []
    # from the registry down, to the loss and to the table cell
    assert files[:2] == ["params.yaml", "src/hnclip/config/registry.py"]
    assert {"src/hnclip/training/loop.py", "src/hnclip/losses/objective.py", "src/hnclip/evaluation/retrieval.py",
            "src/hnclip/evaluation/selection.py", "src/hnclip/report/build.py",
            "src/hnclip/report/tables.py"} <= set(files)
    # Each module after the registry is reached from an earlier one: imported (called) by a module listed
    # before it, or named, in its item, by a record (a name the code writes there, from a function object).
    from test_layers import imported_modules
    names = recorded_code_names()
    listed: list[str] = []
    for path, (_, _, text) in zip(files, items):
        module = _python_module(path)
        if module is None or module == "hnclip.config.registry":
            continue
        imported = {name for earlier in listed
                    for _, name in imported_modules(ROOT / "src" / Path(*earlier.split(".")).with_suffix(".py"))}
        called = module in imported or any(name.startswith(module + ".") for name in imported)
        named = [name for name in names.values() if name.startswith(module + ".") and f"`{name}`" in text]
        assert called or named, (path, text)
        listed.append(module)
    for name in names.values():  # every recorded name is code that exists
        module, _, attribute = name.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attribute)), name


def test_the_cell_trace_says_what_the_skipped_glue_does_and_the_glue_does_only_that():
    section = _section(PIPELINE.read_text(encoding="utf-8"), "Tracing one cell")
    skipped = section.split("Skipped, because")[1].split("`hnclip lineage` walks")[0]
    for glue in ("train.smk", "commands/train.py", "evaluate.smk", "commands/evaluate.py", "report.smk",
                 "commands/report.py", "training/methods.py", "training/step.py"):
        assert glue in skipped, glue
    # the rule runs the train command, which calls the loop train.json names
    assert " train --run-id {{wildcards.run}}" in (ROOT / "workflow/rules/train.smk").read_text(encoding="utf-8")
    from test_layers import imported_modules
    commands = ROOT / "src/hnclip/commands"
    assert "hnclip.training.loop.train" in {name for _, name in imported_modules(commands / "train.py")}
    assert recorded_code_names()["train.json training"] == "hnclip.training.loop.train"
    # the table command calls the builder the table's record names
    assert recorded_code_names()["table written_by"] == "hnclip.report.build.build_table"
    assert "build.build_table(reg, name)" in _function_source(commands / "report.py", "build_table")
    # the evaluate command selects with the rule its record names
    assert "select_epochs(" in _function_source(commands / "evaluate.py", "_select")


def test_the_cell_trace_names_the_file_that_adds_gamma_g_and_the_one_that_reads_the_cell():
    _, items = traced_files()
    loss = [path for _, path, text in items if "γG is added" in text]
    assert loss == ["src/hnclip/losses/objective.py"]
    hn_logits = _function_source(ROOT / loss[0], "hn_logits")
    margin_matrix = _function_source(ROOT / loss[0], "margin_matrix")
    assert "margin_matrix(" in hn_logits and "logit_scale * (sims + margins" in hn_logits
    assert "gamma * (feats @ feats.t())" in margin_matrix and "fill_diagonal_(0.0)" in margin_matrix
    global_logits = _function_source(ROOT / loss[0], "global_logits")
    assert "hn_logits(" in global_logits
    # the file the run's record names as the code of its loss terms is that file, in both batch modes
    names = recorded_code_names()
    for role in ("train.json loss_terms", "train.json loss_terms (compute mode)"):
        assert _python_module(loss[0]) == names[role].rpartition(".")[0], role
    # the training loop holds no loss code, and calls the retrieval evaluation itself
    loop = ROOT / "src/hnclip/training/loop.py"
    loop_source = loop.read_text(encoding="utf-8")
    assert "hn_logits" not in loop_source and "margin_matrix" not in loop_source
    assert "evaluate_model(" in _function_source(loop, "evaluate_all")
    assert "evaluate_all(" in _function_source(loop, "end_of_epoch")
    assert "end_of_epoch(" in _function_source(loop, "_epochs")
    assert not (ROOT / "src/hnclip/training/epoch_eval.py").exists()
    cell = [path for _, path, text in items if 'best.metrics.t2i["R@1"]' in text]
    assert cell == ["src/hnclip/report/tables.py"]
    collect = _function_source(ROOT / cell[0], "collect")
    assert 'read_json(path)[selection]' in collect and 'chosen["metrics"][direction][metric]' in collect
    assert "tables.collect(" in _function_source(ROOT / "src/hnclip/report/build.py", "build_table")


def test_the_cell_trace_needs_at_most_eight_files():
    stated, items = traced_files()
    assert stated == len(items) <= TRACE_LIMIT


def test_a_method_names_the_loss_function_its_terms_call(monkeypatch):
    """`Method.loss_function` is the function object `terms` calls, never a name typed beside it."""
    from types import SimpleNamespace

    from hnclip.training import methods
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return {"total": 0.0}
    monkeypatch.setattr(methods, "loss_terms", spy)
    method = methods.build_method("full", {"framework": "full", "gamma": 0.25, "lambda_tok": 1.0}, {}, None,
                                  SimpleNamespace(batch=None), {}, None)
    assert method.loss_function is spy
    method.terms("model", ("images", "tokens"), methods.Position(0, 3, 6))
    assert calls == [("model", "images", "tokens", {"framework": "full", "gamma": 0.25, "lambda_tok": 1.0}, None,
                      contextlib.nullcontext, (0, 3))]


def test_a_fresh_train_record_names_the_loss_function_the_method_used(tiny_data, tmp_path, monkeypatch):
    from helpers.training import EVALUATION, EXECUTION, SPEC

    import hnclip.losses.objective as objective
    from hnclip.evaluation import retrieval
    from hnclip.training import loop
    built = []
    real_build = loop.build_method
    monkeypatch.setattr(loop, "build_method", lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    spec = {**SPEC, "recipe": {**SPEC["recipe"], "epochs": 1}}
    job = loop.TrainJob(run_id="trace-run", spec=spec, spec_hash="t" * 64, init_kind="scratch", init_path=None,
                        model_config="hnclip-tiny", train_manifest=tiny_data["train"],
                        eval_manifests={"docci": tiny_data["test"]}, out_dir=tmp_path / "run",
                        checkpoint_dir=tmp_path / "ckpt", execution=EXECUTION, evaluation=EVALUATION)
    loop.train(job)
    code = json.loads((tmp_path / "run" / "train.json").read_text())["code"]

    def resolve(name: str):
        module, _, attribute = name.rpartition(".")
        return getattr(importlib.import_module(module), attribute)
    method, = built
    assert resolve(code["loss_terms"]) is method.loss_function is objective.loss_terms
    assert resolve(code["recall"]) is retrieval.evaluate_model
    assert resolve(code["training"]) is loop.train


# ---- README's numbers are those of the latest benchmark records -----------------------------------------
def latest_record(name: str) -> dict:
    import json
    lines = (ROOT / "benchmarks" / "results" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return json.loads([line for line in lines if line.strip()][-1])


def _min_s(seconds: float) -> str:
    minutes, rest = divmod(int(seconds + 0.5), 60)
    return f"{minutes} min {rest} s"


def readme_benchmark_numbers() -> list[tuple[str, str]]:
    """(what README says, as a pattern to find, what the latest record gives) for every number README quotes
    from benchmarks/results/."""
    ci, command1, costs, rehearsal = (latest_record(name) for name in
                                      ("ci_walltime", "command1", "command1_costs", "rehearsal"))
    gemm = sum(ci["gemm_gflops_1thread"].values()) / 2
    rehearsal_fixture = next(t["s"] for t in ci["slowest"] if t["test"].startswith("tests/test_paper_rehearsal.py"))
    jobs_min = (costs["total_job_s"] - costs["pretrain_s"] - costs["step_timing_s"]) / 60
    first_min = (costs["pretrain_s"] + costs["step_timing_s"]) / 60
    return [
        # command 2: the latest CI record
        (r"On a fresh clone with 2 quiet cores it took (\d+ min \d+ s) at commit", _min_s(ci["wall_s"])),
        (r"at commit (\w+),\s+venv build", ci["commit"][:7]),
        (r"venv build\s+included \((\d+ s)\)", f"{int(ci['setup_s'] + 0.5)} s"),
        (r"single-thread GEMM at about (\d+) GFLOPS", f"{round(gemm, -1):.0f}"),
        (r"paper-profile rehearsal, took (\d+\.\d) min of it", f"{rehearsal_fixture / 60:.1f}"),
        (r"\(first time (\d+ s), see command 2", f"{int(ci['setup_s'] + 0.5)} s"),
        # command 1: the latest cold run and its costs
        (r"A cold run took (\d+\.\d) min on 2 CPU cores", f"{command1['cold_s'] / 60:.1f}"),
        (r"\(single-thread GEMM\s+about (\d+) GFLOPS\)",
         f"{round(sum(command1['gemm_gflops_1thread'].values()) / 2, -1):.0f}"),
        (r"GFLOPS\), (\d\.\d\d)× the least time", f"{costs['cold_s'] / costs['compute_bound_s']:.2f}"),
        (r"pretraining \((\d+) min here\)", f"{costs['pretrain_s'] / 60:.0f}"),
        (r"an? (\d+)-minute timing job", f"{costs['step_timing_s'] / 60:.0f}"),
        (r"about (\d+) min of one-thread jobs", f"{jobs_min:.0f}"),
        (r"about (\d+\.\d) \+ \d+ / \*cores\* minutes", f"{first_min:.1f}"),
        (r"1 core,\s+derived rather than measured: about (\d\.\d) h", f"{(first_min + jobs_min) / 60:.1f}"),
        (r"8 cores: about (\d+) min", f"{first_min + jobs_min / 8:.0f}"),
        (r"trains nothing \((\d+) s\)", f"{command1['noop_s']:.0f}"),
        # the rehearsal profile's wall time
        (r"CPU \(about (\d+\.\d) min on 2 cores\)", f"{rehearsal['wall_s'] / 60:.1f}"),
    ]


@pytest.mark.parametrize("pattern, expected", readme_benchmark_numbers(), ids=lambda v: str(v)[:40])
def test_readme_quotes_the_latest_benchmark_records(pattern, expected):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.findall(pattern, readme)
    assert stated, f"README no longer matches {pattern!r}: state the number so that this test can read it"
    assert set(stated) == {expected}, pattern


def test_the_new_objective_key_lists_the_files_its_trial_touched_at_most_six():
    """docs/pipeline.md's list of files for a new objective key is the list the top-k trial needed: numbered,
    as many as the text says, at most six, each a file of the project."""
    section = _section(PIPELINE.read_text(encoding="utf-8"), "Adding a method")
    part = section.split("**A new objective key**")[1].split("**A new framework")[0]
    stated = re.search(r"took these (\w+) files:", part).group(1)
    items = re.findall(r"^(\d+)\. `([^`]+)`", part, flags=re.M)
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    assert [int(n) for n, _ in items] == list(range(1, words[stated] + 1)) and len(items) <= 6
    assert [path for _, path in items if not (ROOT / path).is_file()] == []
