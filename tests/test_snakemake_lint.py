"""`snakemake --lint` reports nothing about the workflow but the one note it keeps on purpose: no rule
names a conda environment or a container, because every rule runs in the one environment pinned by
requirements.lock (docs/scale-out.md, "Deploying the software"). And the container recipe
(workflow/envs/hnclip.def) installs exactly that lock, with setup.sh's steps; it is read here, not built."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
RECIPE = ROOT / "workflow" / "envs" / "hnclip.def"
SOFTWARE_NOTE = "Specify a conda environment or container for each rule."


# ---- snakemake --lint ----------------------------------------------------------------------------
def lint_items(output: str) -> list[tuple[str, str, str]]:
    """(kind, name, title) of each lint in `snakemake --lint`'s text output: kind "rule" (name: the rule)
    or "snakefile" (name: its path). (`--lint json` prints text too in Snakemake 9.27: the CLI drops the
    format.)"""
    items, subject = [], None
    for line in output.splitlines():
        header = re.match(r"^Lints for (?:rule (\w+) \(line \d+, .+\)|snakefile (.+)):$", line)
        if header:
            subject = ("rule", header.group(1)) if header.group(1) else ("snakefile", header.group(2))
        elif line.startswith("    * "):
            assert subject is not None, f"a lint outside a 'Lints for' block: {line!r}"
            items.append((*subject, line[len("    * "):].rstrip(":")))
    return items


def workflow_rules() -> set[str]:
    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    return {name for path in files for name in re.findall(r"^(?:rule|checkpoint) (\w+):", path.read_text(), re.M)}


def test_lint_reports_only_the_per_rule_software_note():
    proc = subprocess.run([str(SNAKEMAKE), "--lint"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    items = lint_items(output)
    assert len(items) == output.count("\n    * "), output[-3000:]  # every lint was parsed
    assert items and proc.returncode == 1, output[-3000:]  # exit status 1: lints were printed
    others = [item for item in items if item[0] != "rule" or item[2] != SOFTWARE_NOTE]
    assert not others, f"lints besides the conda/container note: {others}"
    linted = [name for _, name, _ in items]
    assert len(linted) == len(set(linted))
    # every rule with a command gets the note (rule all runs nothing)
    assert set(linted) == workflow_rules() - {"all"}


def test_lint_items_are_read_from_snakemakes_text():
    text = ("Lints for snakefile /w/workflow/rules/claims.smk:\n"
            "    * Mixed rules and functions in same snakefile.:\n"
            "      Small one-liner functions used only once should be defined as lambda\n\n"
            "Lints for rule train (line 6, /w/workflow/rules/train.smk):\n"
            f"    * {SOFTWARE_NOTE}:\n"
            "      This way, the used software for each specific step is documented, and the\n")
    assert lint_items(text) == [
        ("snakefile", "/w/workflow/rules/claims.smk", "Mixed rules and functions in same snakefile."),
        ("rule", "train", SOFTWARE_NOTE)]


# ---- the container recipe ------------------------------------------------------------------------
def recipe_sections(text: str) -> dict[str, list[str]]:
    """Apptainer definition file: {"header": lines, "files": lines, "post": lines, ...}, without blank
    lines and comments (where the section is a shell script or the header)."""
    sections, name = {"header": []}, "header"
    for line in text.splitlines():
        marker = re.match(r"^%(\w+)", line)
        if marker:
            name = marker.group(1)
            sections.setdefault(name, [])
        elif line.strip() and not line.lstrip().startswith("#"):
            sections[name].append(line.strip())
    return sections


def shell_commands(lines: list[str]) -> list[list[str]]:
    """A section's commands as argument lists (continuation lines joined)."""
    return [shlex.split(command) for command in "\n".join(lines).replace("\\\n", " ").splitlines()]


def setup_sh_command(pattern: str) -> list[str]:
    """The arguments of setup.sh's one line matching `pattern` (a trailing continuation dropped)."""
    (line,) = [line for line in (ROOT / "setup.sh").read_text().splitlines() if re.search(pattern, line)]
    return shlex.split(line.rstrip().removesuffix("\\"))


def test_recipe_installs_exactly_the_lock_as_setup_sh_does():
    sections = recipe_sections(RECIPE.read_text())
    header = dict(line.split(":", 1) for line in sections["header"])
    assert header["Bootstrap"].strip() == "docker"
    # the interpreter the lock was made for (this venv's: every compiled wheel is cp311)
    assert re.fullmatch(r"python:3\.11-slim-bookworm(@sha256:[0-9a-f]{64})?", header["From"].strip())
    assert sys.version_info[:2] == (3, 11)
    copied = dict(line.split() for line in sections["files"])  # what the install reads, not .venv or data
    assert copied == {name: f"/opt/hnclip/{name}" for name in ("requirements.lock", "pyproject.toml", "README.md",
                                                               "src")}
    commands = shell_commands(sections["post"])
    pips = [cmd for cmd in commands if cmd[:2] == ["/opt/venv/bin/pip", "install"]]
    assert ["cd", "/opt/hnclip"] in commands
    # the lock, pin by pin without resolving, then the project, editable and without dependencies: no
    # package from anywhere else (apt only brings git)
    assert len(pips) == 2
    lock_install, project_install = pips
    assert "--no-deps" in lock_install and lock_install[-2:] == ["-r", "requirements.lock"]
    assert "--no-deps" in project_install and project_install[-2:] == ["-e", "."]
    assert ["/opt/venv/bin/pip", "check"] in commands
    installs = [cmd for cmd in commands if "install" in cmd]
    assert installs == [["apt-get", "install", "-y", "--no-install-recommends", "git"], *pips]
    # setup.sh's flags, the packages it byte-compiles and its fingerprint of the lock
    setup_pip = setup_sh_command(r'pip install .*-r "\$part"')
    setup_flags = {arg for arg in setup_pip if arg.startswith("--")}
    assert {"--no-deps", "--no-compile"} <= setup_flags <= set(lock_install)
    setup_compile = setup_sh_command(r"compileall .* -x ")
    exclude = setup_compile[setup_compile.index("-x") + 1]
    assert any("-x" in cmd and cmd[cmd.index("-x") + 1] == exclude for cmd in commands)
    (fingerprint,) = re.findall(r"^want=\$\((.+)\)$", (ROOT / "setup.sh").read_text(), re.M)
    assert f"{fingerprint} > /opt/venv/.lock-sha256" in sections["post"]
    assert any(fingerprint in line for line in sections["runscript"])
    # the image's environment first on PATH; the GPU flag in the documented command
    assert "export PATH=/opt/venv/bin:$PATH" in sections["environment"]
    assert "apptainer run --nv" in RECIPE.read_text()
