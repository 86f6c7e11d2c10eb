"""Process reuse for short jobs: `python -m hnclip.runtime.warm ARGS` behaves as `python -m hnclip ARGS`.

Every `hnclip` job of the embedded profile starts a Python process that imports torch and open_clip
(about 5 s on the 2-core machine) to do seconds of work; 250 jobs spend minutes of command 1 on
imports alone. This launcher hands its arguments, working directory, environment and standard
streams (fds 0-2, over a Unix socket) to a per-user server that has imported them once and forks a
child per job. The child runs `hnclip.cli.main` as a fresh interpreter would; the client forwards
SIGINT/SIGTERM/SIGHUP to it and exits with its status (or dies of its signal).

Safety rules, each for a reason:
- A server serves one *import key*: the interpreter, the package's files (name, size, mtime) and the
  environment variables read at import time (OMP_*, MKL_*, TORCH*, PYTHON*, ...). Changed code or a
  different thread policy reaches a new server; the old one exits when idle.
- The server never computes: OpenMP and CUDA are initialised in the child, after the fork.
- No server, an old one, a failed handshake: the job runs in the client's own process (and a server
  is started in the background for the next job). Nothing a job does depends on the server.
- `HNCLIP_WARM=0` turns the launcher into plain `python -m hnclip`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

DISABLE_ENV = "HNCLIP_WARM"
DIR_ENV = "HNCLIP_WARM_DIR"
IDLE_EXIT_S = 60.0
HANDSHAKE_TIMEOUT_S = 5.0
# Read by libraries while they are imported (thread pools, allocators, caches, interpreter flags):
# part of the server's key, so a job never runs under another job's import-time settings.
IMPORT_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "NVIDIA",
                       "ASCEND", "PYTHON", "LD_", "MALLOC", "MPL", "HF_", "HUGGINGFACE", "XDG_", "HOME")
# Imported once by the server; each is optional (a missing one is imported by the child as usual).
# What jobs import, so that no job imports it again: pyplot (figures, metrics' convergence rows), TensorBoard's
# writer (every training run's curves), the segmenter (auxiliary jobs).
PRELOAD = ("numpy", "PIL.Image", "yaml", "torch", "open_clip", "pandas", "matplotlib", "matplotlib.pyplot",
           "torch.utils.tensorboard", "hnclip.cli", "hnclip.commands.train", "hnclip.commands.evaluate",
           "hnclip.commands.stats", "hnclip.commands.auxiliary", "hnclip.auxiliary.segments",
           "hnclip.commands.report", "hnclip.report.figures", "hnclip.commands.metrics", "hnclip.commands.claims",
           "hnclip.commands.data")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_HEADER = struct.Struct("!I")


# ---- where a server lives ------------------------------------------------------------------------
def import_key(environ: dict[str, str]) -> str:
    """What a preloaded interpreter depends on: interpreter, package files, installed packages,
    import-time environment. Two jobs with the same key can share one server."""
    package = Path(__file__).resolve().parents[1]
    files = sorted((str(p.relative_to(package)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    # sys.path[0] is the job's working directory under `-m`: not part of what the server imported
    installed = [(entry, os.stat(entry).st_mtime_ns) for entry in sys.path[1:] if os.path.isdir(entry)]
    env = sorted((k, v) for k, v in environ.items() if k.startswith(IMPORT_ENV_PREFIXES))
    blob = json.dumps([sys.executable, sys.version, files, installed, env])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def socket_path(environ: dict[str, str]) -> Path:
    """The server socket for this key, in a private per-user directory."""
    base = Path(environ.get(DIR_ENV) or Path("/tmp") / f"hnclip-warm-{os.getuid()}")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if base.stat().st_uid != os.getuid() or base.stat().st_mode & 0o077:
        raise PermissionError(f"{base} must be a private directory of this user (mode 0700)")
    return base / f"{import_key(environ)}.sock"


# An AF_UNIX address holds at most 107 bytes; a deeper HNCLIP_WARM_DIR (a test's tmp_path) is reached
# through an open descriptor of the socket's directory instead.
MAX_SOCKET_ADDRESS = 100


@contextlib.contextmanager
def socket_address(path: Path):
    """An address for the socket file `path` that bind/connect accept: the path itself when it is short
    enough, else the same file through /proc/self/fd/<directory descriptor>/<name> (Linux)."""
    if len(os.fsencode(str(path))) <= MAX_SOCKET_ADDRESS or not Path("/proc/self/fd").is_dir():
        yield str(path)  # short, or no /proc: bind/connect say "path too long" and the job runs in process
        return
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


# ---- framing: a 4-byte length, then JSON ------------------------------------------------------------
def _send_message(conn: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(conn, [payload], fds)
        payload = payload[sent:]
    if payload:
        conn.sendall(payload)


def _read_exact(conn: socket.socket, size: int, data: bytes = b"") -> bytes:
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise ConnectionError("connection closed inside a message")
        data += more
    return data


def _receive_message(conn: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """(message, fds); message None on a clean EOF before any byte. Reads exactly one message (the
    fds travel with its first bytes), so a second message on the same connection is left unread."""
    if max_fds:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, max_fds)
    else:
        head, fds = conn.recv(_HEADER.size), []
    if not head:
        return None, fds
    (length,) = _HEADER.unpack(_read_exact(conn, _HEADER.size, head))
    return json.loads(_read_exact(conn, length)), fds


# ---- client ----------------------------------------------------------------------------------------
def run_in_process(argv: list[str]) -> int:
    # The one upward import of the package, by design: this server's whole job is to run the CLI.
    from hnclip.cli import main  # layer-exception: runtime.warm runs the CLI
    return main(argv)


def start_server(path: Path) -> None:
    """A detached server for `path` (it exits at once if another one holds the key's lock)."""
    subprocess.Popen([sys.executable, "-m", "hnclip.runtime.warm", "--serve", str(path)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     cwd=path.parent, start_new_session=True, close_fds=True)


def _exit_like(status: dict) -> int:
    """The client's exit: the child's code, or death by the child's signal."""
    if "signal" in status:
        sig = status["signal"]
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # pragma: no cover - the signal ends the process first
    return int(status.get("code", 1))


def run_warm(argv: list[str], path: Path) -> int | None:
    """Run the job in a server's child; None if no server took it (then nothing has started)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        with socket_address(path) as address:
            conn.connect(address)
        _send_message(conn, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                             "argv0": sys.argv[0]}, [0, 1, 2])
        started, _ = _receive_message(conn)
    except OSError:
        conn.close()
        return None
    if not started or "pid" not in started:
        conn.close()
        return None
    child = started["pid"]

    def forward(sig, _frame):
        try:
            os.killpg(child, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    conn.settimeout(None)
    try:
        status, _ = _receive_message(conn)
    except OSError:
        status = None
    finally:
        conn.close()
    if status is None:  # the server died: the child's fate is unknown, so stop it and fail loudly
        forward(signal.SIGTERM, None)
        print(f"error: the warm hnclip server ({path}) went away while job {child} ran; rerun the job "
              f"(or set {DISABLE_ENV}=0 to run without it)", file=sys.stderr)
        return 1
    return _exit_like(status)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(Path(argv[1]))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `python -m hnclip` (hnclip/__main__.py)
    if os.environ.get(DISABLE_ENV, "1") == "0" or not hasattr(socket, "send_fds"):
        return run_in_process(argv)
    try:
        path = socket_path(dict(os.environ))
    except OSError as exc:
        print(f"warning: no warm hnclip server ({exc}); running in this process", file=sys.stderr)
        return run_in_process(argv)
    code = run_warm(argv, path)
    if code is None:
        start_server(path)
        code = run_in_process(argv)
    return code


# ---- server ----------------------------------------------------------------------------------------
def _preload(modules) -> None:
    import importlib
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the child imports (and reports) it itself
            pass


def _exit_status(wait_status: int) -> dict:
    if os.WIFSIGNALED(wait_status):
        return {"signal": os.WTERMSIG(wait_status)}
    return {"code": os.waitstatus_to_exitcode(wait_status)}


def _fresh_stdio() -> None:
    """Text streams over the job's fds 0-2 as a new interpreter makes them (line-buffered on a tty)."""
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if os.isatty(1) else -1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)


def _child(request: dict, fds: list[int]) -> int:
    """In the forked child: become the job's process and run it; returns the exit code."""
    import random
    import tempfile
    os.setpgid(0, 0)  # the client signals, and the server stops, the job's whole process group
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # re-read TMPDIR from the job's environment
    sys.argv = [request["argv0"], *request["argv"]]
    sys.path[0] = request["cwd"]
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    _fresh_stdio()
    try:
        from hnclip.cli import main  # layer-exception: runtime.warm runs the CLI
        code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # die of SIGINT, as the interpreter does
        code = 130
    except BaseException:  # noqa: BLE001 - reported as an uncaught exception is
        import traceback
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


class _Server:
    """One listening socket; a forked child per request; the reply is the child's wait status."""

    def __init__(self, path: Path):
        import selectors
        self.path = path
        self.selector = selectors.DefaultSelector()
        self.jobs: dict[int, socket.socket] = {}  # child pid -> its client's connection
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = path.with_name(f"{path.name}.{os.getpid()}")
        staging.unlink(missing_ok=True)
        with socket_address(staging) as address:
            self.listener.bind(address)
        self.listener.listen(64)
        os.replace(staging, path)  # the socket appears ready to accept, never half-made
        self.inode = path.stat().st_ino
        self.selector.register(self.listener, 1, None)  # 1: EVENT_READ

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        fds: list[int] = []
        try:
            request, fds = _receive_message(conn, max_fds=3)
            if request is None or len(fds) != 3:
                raise ConnectionError("incomplete request")
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        pid = os.fork()
        if pid == 0:  # the job
            code = 1
            try:
                self.selector.close()
                self.listener.close()
                conn.close()
                for other in self.jobs.values():
                    other.close()
                code = _child(request, fds)
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)  # as the child does: the group exists before the client can signal it
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        try:
            _send_message(conn, {"pid": pid})
        except OSError:  # the client is gone before the job started
            os.killpg(pid, signal.SIGKILL)
        conn.setblocking(False)
        self.jobs[pid] = conn
        self.selector.register(conn, 1, pid)

    def client_event(self, conn: socket.socket, pid: int) -> None:
        """A job's client is readable: it has nothing to say, so this is its end (killed, closed)."""
        try:
            if conn.recv(1):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.selector.unregister(conn)
        if _group_exists(pid):
            os.killpg(pid, signal.SIGTERM)  # no one is waiting for this job any more

    def reap(self) -> None:
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.jobs.pop(pid, None)
            if conn is None:
                continue
            try:
                self.selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            try:
                conn.setblocking(True)
                conn.settimeout(HANDSHAKE_TIMEOUT_S)
                _send_message(conn, _exit_status(status))
            except OSError:
                pass
            conn.close()

    def still_ours(self) -> bool:
        try:
            return self.path.stat().st_ino == self.inode
        except FileNotFoundError:
            return False

    def loop(self, idle_exit_s: float) -> None:
        last_busy = time.monotonic()
        while True:
            for key, _ in self.selector.select(timeout=0.2):
                if key.data is None:
                    self.accept()
                else:
                    self.client_event(key.fileobj, key.data)
            self.reap()
            if self.jobs:
                last_busy = time.monotonic()
            elif time.monotonic() - last_busy > idle_exit_s or not self.still_ours():
                return

    def close(self) -> None:
        if self.still_ours():
            self.path.unlink(missing_ok=True)
        self.listener.close()


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def serve(path: Path, idle_exit_s: float | None = None, preload=PRELOAD) -> int:
    """Serve `path` until idle (HNCLIP_WARM_IDLE_S, default 60 s); 0 at once if another server holds it."""
    import fcntl
    lock = open(path.with_suffix(".lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    _preload(preload)
    server = _Server(path)
    try:
        server.loop(float(os.environ.get("HNCLIP_WARM_IDLE_S", IDLE_EXIT_S)) if idle_exit_s is None else idle_exit_s)
    finally:
        server.close()
        lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
