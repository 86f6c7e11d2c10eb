#!/usr/bin/env python3
"""A real single-node SLURM cluster on 127.0.0.1, under one temporary directory.

For trying the SLURM profile (workflow/profiles/slurm) on a workstation and for tests/test_slurm.py:

    eval "$(python scripts/local_slurm.py start [--dir D])"   # prints the variables to export
    python scripts/local_slurm.py status --dir D
    python scripts/local_slurm.py stop --dir D

`start` installs the Debian packages when they are missing (slurmctld slurmd slurm-client munge;
root and apt-get needed), writes a munge key and a slurm.conf under D, starts munged, slurmctld
and slurmd, records their PIDs in D/state.json and waits until the node is idle. `stop` cancels
every job, waits for the queue to drain, then ends the daemons by their recorded PIDs (TERM, then
KILL) and removes D. Nothing is written outside D; ports are chosen free, so several clusters can
run side by side. Accounting (slurmdbd) is left out: `sacct` does not work here, so Snakemake
must be run with `--slurm-status-command squeue` (MinJobAge is high enough for that).

Python standard library only: the functions `start_cluster(dir)` and `stop_cluster(handle)` are
imported by the test fixture.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
REQUIRED_BINARIES = ("slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "srun", "scancel", "munged", "mungekey")
PARTITION = "debug"
# The executor plugin polls with squeue only while finished jobs stay listed for at least
# 3x its first status interval; 300 s covers --slurm-init-seconds-before-status-checks <= 100.
MIN_JOB_AGE_S = 300
STATE_FILE = "state.json"
DAEMON_ORDER = ("munged", "slurmctld", "slurmd")  # start order; stopped in reverse


class ClusterError(RuntimeError):
    """The cluster could not be installed, started or reached; the message says why."""


@dataclass
class ClusterHandle:
    dir: Path
    slurm_conf: Path
    shim_dir: Path          # holds the `srun` wrapper that restores SLURM_CONF inside jobs
    node: str
    partition: str
    cpus: int
    memory_mb: int
    gpus: int
    gpu_type: str
    pids: dict[str, int]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default: os.environ) plus what every SLURM client of this cluster needs."""
        base = dict(os.environ if base is None else base)
        return {**base, "SLURM_CONF": str(self.slurm_conf), "PATH": f"{self.shim_dir}:{base.get('PATH', '')}"}

    def exports(self) -> str:
        """Shell lines for `eval "$(python scripts/local_slurm.py start)"`."""
        return (f"export SLURM_CONF={self.slurm_conf}\nexport PATH={self.shim_dir}:$PATH\n"
                f"export HNCLIP_SLURM_DIR={self.dir}")

    def save(self) -> None:
        state = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        (self.dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    @classmethod
    def load(cls, directory: Path | str) -> "ClusterHandle":
        state_path = Path(directory) / STATE_FILE
        if not state_path.exists():
            raise ClusterError(f"no cluster state at {state_path}")
        state = json.loads(state_path.read_text())
        for key in ("dir", "slurm_conf", "shim_dir"):
            state[key] = Path(state[key])
        return cls(**state)


# ---- installation --------------------------------------------------------------------------------
def missing_binaries() -> list[str]:
    return [name for name in REQUIRED_BINARIES if shutil.which(name) is None]


def _apt_get(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], env=env, capture_output=True, text=True)


def ensure_packages() -> None:
    """Install the Debian packages when a binary is missing; ClusterError with the reason otherwise."""
    if not missing_binaries():
        return
    if shutil.which("apt-get") is None:
        raise ClusterError(f"missing {', '.join(missing_binaries())} and apt-get is not available "
                           f"to install {' '.join(PACKAGES)}")
    if os.geteuid() != 0:
        raise ClusterError(f"missing {', '.join(missing_binaries())}; installing {' '.join(PACKAGES)} needs root")
    install = ("install", "-y", "--no-install-recommends", *PACKAGES)
    proc = _apt_get(*install)
    if proc.returncode != 0:  # a fresh container often has no package lists yet
        _apt_get("update")
        proc = _apt_get(*install)
    if proc.returncode != 0:
        raise ClusterError(f"apt-get {' '.join(install)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    if missing_binaries():
        raise ClusterError(f"still missing after apt-get install: {', '.join(missing_binaries())}")


# ---- configuration -------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_memory_mb() -> int:
    """What slurmd will measure, less a margin, so the node is not drained for 'Low RealMemory'."""
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return max(256, int(pages * page_size / 2**20 * 0.9))


@dataclass
class NodeShape:
    """What the node offers. Declared sizes above the real ones are honoured (config_overrides), so
    a laptop can accept the paper profile's requests (8 CPUs, 64 GB, an A100) and run them on CPU."""
    cpus: int
    memory_mb: int
    gpus: int = 0
    gpu_type: str = "a100"
    overrides: bool = False

    def node_line(self, node: str) -> str:
        gres = f" Gres=gpu:{self.gpu_type}:{self.gpus}" if self.gpus else ""
        return f"NodeName={node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb}{gres} State=UNKNOWN"


def slurm_conf_text(root: Path, node: str, shape: NodeShape, ports: tuple[int, int]) -> str:
    ctld_port, slurmd_port = ports
    extra = "GresTypes=gpu\n" if shape.gpus else ""
    extra += "SlurmdParameters=config_overrides\n" if shape.overrides or shape.gpus else ""
    return f"""\
# Written by scripts/local_slurm.py: a one-node cluster for testing, everything under {root}.
ClusterName=hnclip-local
{extra}SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# Our own munged socket, not the system one (/run/munge).
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
# No systemd/cgroups in a container: plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge={MIN_JOB_AGE_S}
{shape.node_line(node)}
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def write_fake_gpus(root: Path, node: str, shape: NodeShape) -> None:
    """GPU GRES backed by /dev/null: SLURM schedules them and sets CUDA_VISIBLE_DEVICES per job."""
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    for index in range(shape.gpus):
        (dev / f"gpu{index}").symlink_to("/dev/null")  # gres/gpu wants a device file; the index is its suffix
    files = f"{dev}/gpu[0-{shape.gpus - 1}]" if shape.gpus > 1 else f"{dev}/gpu0"
    (root / "gres.conf").write_text(f"AutoDetect=off\nNodeName={node} Name=gpu Type={shape.gpu_type} File={files}\n")


def write_srun_shim(shim_dir: Path, slurm_conf: Path) -> None:
    """The jobstep plugin strips SLURM_* (SLURM_CONF too) before its in-job `srun`; put it back."""
    real_srun = shutil.which("srun", path=os.defpath + ":/usr/bin:/usr/local/bin")
    shim_dir.mkdir(parents=True, exist_ok=True)
    shim = shim_dir / "srun"
    shim.write_text(f'#!/bin/sh\nexport SLURM_CONF="{slurm_conf}"\nexec {real_srun} "$@"\n')
    shim.chmod(0o755)


def prepare_dir(root: Path) -> None:
    for sub in ("munge", "state", "spool", "run", "log", "bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)


# ---- daemons -------------------------------------------------------------------------------------
def spawn(name: str, argv: list[str], root: Path, env: dict[str, str]) -> int:
    """Start a daemon in its own session (it outlives `local_slurm.py start`); return its PID."""
    log = open(root / "log" / f"{name}.out", "ab")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log.close()
    return proc.pid


def wait_for(condition, timeout_s: float, what: str, root: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{log_tails(root)}")


def log_tails(root: Path, chars: int = 1500) -> str:
    parts = []
    for log in sorted((root / "log").glob("*")):
        text = log.read_text(errors="replace")[-chars:]
        if text.strip():
            parts.append(f"--- {log}\n{text}")
    return "\n".join(parts)


def node_states(env: dict[str, str]) -> list[str]:
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return []
    return proc.stdout.split() if proc.returncode == 0 else []


def start_munged(root: Path, env: dict[str, str]) -> int:
    key = root / "munge" / "munge.key"
    made = subprocess.run(["mungekey", "-c", "-k", str(key)], capture_output=True, text=True)
    if made.returncode != 0:
        raise ClusterError(f"mungekey failed: {made.stderr.strip()}")
    pid = spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}",
                           f"--socket={root}/munge/munge.sock", f"--pid-file={root}/run/munged.pid",
                           f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/munged.seed"], root, env)
    wait_for(lambda: (root / "munge" / "munge.sock").exists(), 10, "munged's socket", root)
    return pid


def is_daemon(name: str, pid: int) -> bool:
    """Whether `pid` still runs `name`: a PID recorded long ago may belong to another process now."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return Path(argv0).name == name


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of this process still answers kill(0): reap it if it is ours.
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def start_cluster(directory: Path | str | None = None, cpus: int | None = None, memory_mb: int | None = None,
                  gpus: int = 0, gpu_type: str = "a100", timeout_s: float = 60) -> ClusterHandle:
    """Install if needed, start munged + slurmctld + slurmd under `directory`, wait for an idle node.

    By default the node offers this machine's CPUs and memory and no GPU. `cpus`/`memory_mb` declare
    other sizes and `gpus` adds fake GPUs of GRES type `gpu_type` (jobs still run on the CPU).
    """
    ensure_packages()
    root = Path(directory or tempfile.mkdtemp(prefix="hnclip-slurm-")).resolve()
    prepare_dir(root)
    node = socket.gethostname().split(".")[0]
    shape = NodeShape(cpus=cpus or os.cpu_count() or 1, memory_mb=memory_mb or node_memory_mb(), gpus=gpus,
                      gpu_type=gpu_type, overrides=bool(cpus or memory_mb))
    handle = ClusterHandle(dir=root, slurm_conf=root / "slurm.conf", shim_dir=root / "bin", node=node,
                           partition=PARTITION, cpus=shape.cpus, memory_mb=shape.memory_mb, gpus=gpus,
                           gpu_type=gpu_type, pids={})
    handle.slurm_conf.write_text(slurm_conf_text(root, node, shape, (free_port(), free_port())))
    if gpus:
        write_fake_gpus(root, node, shape)
    write_srun_shim(handle.shim_dir, handle.slurm_conf)
    try:
        start_daemons(handle, timeout_s)
    except BaseException:
        stop_cluster(handle, remove_dir=directory is None)  # keep a caller's directory for its logs
        raise
    return handle


def start_daemons(handle: ClusterHandle, timeout_s: float = 60) -> None:
    """munged, then slurmctld, then slurmd; each PID is saved as soon as it exists."""
    root, env = handle.dir, handle.env()
    handle.pids["munged"] = start_munged(root, env)
    handle.save()
    handle.pids["slurmctld"] = spawn("slurmctld", ["slurmctld", "-D", "-i"], root, env)  # -i: ignore old state
    handle.save()
    handle.pids["slurmd"] = spawn("slurmd", ["slurmd", "-D", "-N", handle.node], root, env)
    handle.save()
    wait_for(lambda: node_states(env) == ["idle"], timeout_s, f"node {handle.node} to be idle", root)


def cancel_all_jobs(handle: ClusterHandle, timeout_s: float = 20) -> None:
    """Cancel jobs first: their slurmstepd and job processes would outlive slurmd otherwise."""
    env = handle.env()

    def queue_empty() -> bool:
        proc = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=10)
        return proc.returncode != 0 or not proc.stdout.strip()  # an unreachable controller has no queue

    try:
        subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=env, capture_output=True, timeout=10)
        deadline = time.monotonic() + timeout_s
        while not queue_empty() and time.monotonic() < deadline:
            time.sleep(0.3)
    except (subprocess.TimeoutExpired, FileNotFoundError):
        pass  # the daemons are ended below regardless


def end_process(pid: int, timeout_s: float = 10) -> None:
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def stop_cluster(handle: ClusterHandle, remove_dir: bool = True) -> None:
    """Cancel all jobs, end the daemons by their recorded PIDs (TERM, then KILL), remove the directory."""
    if "slurmctld" in handle.pids and is_daemon("slurmctld", handle.pids["slurmctld"]):
        cancel_all_jobs(handle)
    for name in reversed(DAEMON_ORDER):
        if name in handle.pids and is_daemon(name, handle.pids[name]):
            end_process(handle.pids[name])
    if remove_dir:
        shutil.rmtree(handle.dir, ignore_errors=True)


def status_report(handle: ClusterHandle) -> tuple[bool, str]:
    states = {name: ("running" if is_daemon(name, pid) else "dead") for name, pid in handle.pids.items()}
    lines = [f"{name}: pid {handle.pids[name]} {state}" for name, state in states.items()]
    up = all(state == "running" for state in states.values()) and len(states) == len(DAEMON_ORDER)
    if up:
        proc = subprocess.run(["sinfo"], env=handle.env(), capture_output=True, text=True, timeout=10)
        lines.append(proc.stdout.strip() or proc.stderr.strip())
    return up, "\n".join(lines)


# ---- command line --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="start a cluster (installs the packages if missing)")
    p.add_argument("--dir", default=None, help="state directory (default: a new temporary directory)")
    p.add_argument("--cpus", type=int, default=None, help="CPUs the node offers (default: all)")
    p.add_argument("--memory-mb", type=int, default=None, help="memory the node offers (default: 90%% of RAM)")
    p.add_argument("--gpus", type=int, default=0, help="fake GPUs the node offers (GRES backed by /dev/null)")
    p.add_argument("--gpu-type", default="a100", help="GRES type of the fake GPUs (default: a100)")
    for name, text in (("stop", "cancel all jobs, stop the daemons, remove the directory"),
                       ("status", "daemon PIDs and sinfo")):
        sub.add_parser(name, help=text).add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            handle = start_cluster(args.dir, cpus=args.cpus, memory_mb=args.memory_mb, gpus=args.gpus,
                                   gpu_type=args.gpu_type)
            print(f"# SLURM cluster up: node {handle.node}, partition {handle.partition}, "
                  f"{handle.cpus} CPUs, {handle.memory_mb} MB, {handle.gpus} GPUs; state in {handle.dir / STATE_FILE}")
            print(handle.exports())
            print(f"# stop with: python {sys.argv[0]} stop --dir $HNCLIP_SLURM_DIR")
            return 0
        handle = ClusterHandle.load(args.dir)
        if args.command == "stop":
            stop_cluster(handle)
            print(f"stopped; removed {handle.dir}")
            return 0
        up, report = status_report(handle)
        print(report)
        return 0 if up else 1
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
