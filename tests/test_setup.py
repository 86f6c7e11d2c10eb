"""setup.sh on a small project: the lock's pins are installed by several pip processes side by side
(each a share of the lines, without resolving), then checked, byte-compiled and stamped; the project's
own modules are byte-compiled on every run; a failed install says which pip failed and stamps nothing,
so the next run builds again."""
from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NO_DEPENDENCIES = ("six", "idna", "certifi")  # small, pinned in the project's lock, depend on nothing


def pins(names) -> list[str]:
    """The project's own pins of `names`: versions the package indexes setup.sh uses are known to hold."""
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return [line for line in lines if line.split("==")[0].lower() in names]


def run_setup(project: Path, lock: list[str], jobs: str = "3", **env_extra: str) -> subprocess.CompletedProcess:
    (project / "setup.sh").write_bytes((ROOT / "setup.sh").read_bytes())
    (project / "setup.sh").chmod(0o755)
    (project / "requirements.lock").write_text("# a comment, skipped\n\n" + "\n".join(lock) + "\n")
    (project / "pyproject.toml").write_text('[project]\nname = "setup-probe"\nversion = "0.1"\n'
                                            '[tool.setuptools]\npy-modules = []\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    return subprocess.run(["./setup.sh"], cwd=project, capture_output=True, text=True, timeout=600,
                          env={**env, "HNCLIP_SETUP_JOBS": jobs, **env_extra})


def test_parallel_pips_install_every_pinned_line_then_stamp(tmp_path):
    lock = pins(NO_DEPENDENCIES)
    assert len(lock) == 3
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "probe_module.py").write_text("VALUE = 1\n")

    def compiled() -> list[Path]:
        return list((tmp_path / "src" / "__pycache__").glob("probe_module.*.pyc"))
    proc = run_setup(tmp_path, lock, jobs="2")  # two processes for three lines: one installs two
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "packages installed in" in proc.stdout and "(2 pip processes)" in proc.stdout
    frozen = subprocess.run([str(tmp_path / ".venv/bin/pip"), "freeze"], capture_output=True, text=True).stdout
    assert set(lock) <= set(frozen.splitlines())
    assert not (tmp_path / ".venv/lock-parts").exists()
    assert list((tmp_path / ".venv/lib").glob("python3*/site-packages/__pycache__/six.*.pyc")), "not byte-compiled"
    assert compiled(), "the project's modules were not byte-compiled"
    shutil.rmtree(tmp_path / "src" / "__pycache__")
    again = run_setup(tmp_path, lock)
    assert again.returncode == 0 and "up to date" in again.stdout
    assert compiled(), "an up-to-date setup did not byte-compile the project's modules"


def test_a_failed_pip_fails_setup_with_its_error_and_stamps_nothing(tmp_path):
    lock = pins(("six",)) + ["hnclip-no-such-package==0.0.1"]
    proc = run_setup(tmp_path, lock)
    assert proc.returncode == 1
    assert "setup: pip install failed" in proc.stdout
    assert "hnclip-no-such-package" in proc.stdout  # the failing pip's own message, not only ours
    assert not (tmp_path / ".venv/.lock-sha256").exists()


@pytest.mark.parametrize("jobs", ["0", "three", "-1"])
def test_the_number_of_pip_processes_must_be_a_positive_integer(tmp_path, jobs):
    proc = run_setup(tmp_path, pins(("six",)), jobs=jobs)
    assert proc.returncode == 2 and "HNCLIP_SETUP_JOBS must be a positive integer" in proc.stdout
    assert not (tmp_path / ".venv").exists()


def fake_wheel(index: Path, name: str, version: str) -> None:
    """A pure-Python wheel `name` `version` in a PEP 503 simple index at `index` (a local stand-in for
    PyTorch's index: nothing is downloaded)."""
    folder = index / name
    folder.mkdir(parents=True)
    wheel = f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    (folder / "index.html").write_text(f'<a href="{wheel.replace("+", "%2B")}">{wheel}</a>\n')


def test_another_torch_build_replaces_the_locks_torch_and_cuda_wheels(tmp_path):
    """HNCLIP_TORCH_BUILD=cpu: the lock's torch and torchvision releases in that build, from the torch index;
    the lock's CUDA wheels (here nvidia-cublas) are not installed; the stamp names the build."""
    index = tmp_path / "index"
    fake_wheel(index / "cpu", "torch", "2.14.1+cpu")
    fake_wheel(index / "cpu", "torchvision", "0.29.1+cpu")
    project = tmp_path / "project"
    project.mkdir()
    lock = pins(("six", "torch", "torchvision", "nvidia-cublas"))
    assert [line.split("==")[0] for line in lock] == ["nvidia-cublas", "six", "torch", "torchvision"]
    proc = run_setup(project, lock, HNCLIP_TORCH_BUILD="cpu", HNCLIP_TORCH_INDEX=index.as_uri())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"torch build cpu from {index.as_uri()}/cpu" in proc.stdout
    frozen = set(subprocess.run([str(project / ".venv/bin/pip"), "freeze"], capture_output=True,
                                text=True).stdout.splitlines())
    assert {"torch==2.14.1+cpu", "torchvision==0.29.1+cpu", *pins(("six",))} <= frozen
    assert not any(line.startswith("nvidia-") for line in frozen)
    assert (project / ".venv/.lock-sha256").read_text().strip().endswith("-cpu")
    again = run_setup(project, lock, HNCLIP_TORCH_BUILD="cpu", HNCLIP_TORCH_INDEX=index.as_uri())
    assert again.returncode == 0 and "up to date" in again.stdout


def test_the_torch_build_must_be_one_the_lock_supports(tmp_path):
    proc = run_setup(tmp_path, pins(("six",)), HNCLIP_TORCH_BUILD="cu121")
    assert proc.returncode == 2 and "HNCLIP_TORCH_BUILD must be cu130, cu128 or cpu, not 'cu121'" in proc.stdout
    assert not (tmp_path / ".venv").exists()
