"""The warm launcher (hnclip.runtime.warm): a job run through a forking server behaves as the same
job in a fresh `python -m hnclip` (output, exit status, working directory, environment, signals),
and every failure to reach a server runs the job in the client's own process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hnclip.runtime import warm

# A server whose jobs are small scripted behaviours instead of hnclip verbs (the child calls
# `hnclip.cli.main`, replaced here), without the preloads: seconds, not a torch import.
FAKE_SERVER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    import hnclip.cli
    from hnclip.runtime.warm import serve

    def fake_main(argv):
        verb = argv[0]
        if verb == "exit":
            print("served", os.getpid(), flush=True)
            return int(argv[1])
        if verb == "where":
            print(os.getcwd(), os.environ.get("WARM_TEST_VALUE"), sys.argv[1:], flush=True)
            return 0
        if verb == "sleep":
            print(os.getpid(), flush=True)
            time.sleep(60)
            return 0
        if verb == "raise":
            raise RuntimeError("boom in the job")
        if verb == "kill9":
            os.kill(os.getpid(), signal.SIGKILL)
        return 99

    hnclip.cli.main = fake_main
    sys.exit(serve(Path(sys.argv[1]), idle_exit_s=float(sys.argv[2]), preload=()))
""")


@pytest.fixture
def warm_env(tmp_path) -> dict[str, str]:
    directory = tmp_path / "warm"
    directory.mkdir(mode=0o700)
    return {**os.environ, warm.DIR_ENV: str(directory), "HNCLIP_WARM_IDLE_S": "3"}


def _socket_for(env) -> Path:
    """The socket a client started with `env` looks for (computed in a child: the key depends on
    the interpreter's sys.path as `python -m` sets it, not as pytest does)."""
    code = "import os; from hnclip.runtime.warm import socket_path; print(socket_path(dict(os.environ)))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def fake_server(warm_env, tmp_path):
    path = _socket_for({**warm_env, "OMP_WAIT_POLICY": warm_env.get("OMP_WAIT_POLICY", "PASSIVE")})
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    proc = subprocess.Popen([sys.executable, str(script), str(path), "30"], env=warm_env)
    assert _wait_for(path.exists), "the fake server never listened"
    yield path
    proc.terminate()
    proc.wait(timeout=10)


def _client(args, env, cwd=None, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "hnclip.runtime.warm", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_exit_status_and_output_come_from_the_served_job(fake_server, warm_env):
    proc = _client(["exit", "3"], warm_env)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    served, pid = out.split()
    assert served == "served" and int(pid) != proc.pid  # it ran in the server's child, not the client


def test_the_job_gets_the_clients_cwd_environment_and_arguments(fake_server, warm_env, tmp_path):
    workdir = tmp_path / "somewhere"
    workdir.mkdir()
    proc = _client(["where", "--x"], {**warm_env, "WARM_TEST_VALUE": "from-client"}, cwd=workdir)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.split(" ", 2)[:2] == [str(workdir), "from-client"]
    assert "['where', '--x']" in out


def test_an_uncaught_exception_fails_the_job_with_its_traceback(fake_server, warm_env):
    proc = _client(["raise"], warm_env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "RuntimeError: boom in the job" in err and "Traceback" in err


def test_a_job_killed_by_a_signal_kills_its_client_with_the_same_signal(fake_server, warm_env):
    proc = _client(["kill9"], warm_env)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_signal_to_the_client_reaches_the_job(fake_server, warm_env):
    proc = _client(["sleep"], warm_env)
    job = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert _wait_for(lambda: not _pid_alive(job), timeout=10)


def test_a_client_that_dies_takes_its_job_with_it(fake_server, warm_env):
    proc = _client(["sleep"], warm_env)
    job = int(proc.stdout.readline())
    proc.kill()  # SIGKILL: nothing forwarded; the server sees the connection close
    proc.wait(timeout=30)
    assert _wait_for(lambda: not _pid_alive(job), timeout=10)


def test_a_second_server_for_the_same_socket_exits_at_once(fake_server):
    started = time.monotonic()
    assert warm.serve(fake_server, idle_exit_s=30, preload=()) == 0
    assert time.monotonic() - started < 5


def test_an_idle_server_exits_and_removes_its_socket(tmp_path):
    path = tmp_path / "idle.sock"
    assert warm.serve(path, idle_exit_s=0.3, preload=()) == 0
    assert not path.exists()


def test_the_key_follows_import_time_environment_only():
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    assert warm.import_key(base) == warm.import_key({**base, "UNRELATED": "x"})
    assert warm.import_key(base) != warm.import_key({**base, "OMP_NUM_THREADS": "2"})
    assert warm.import_key(base) != warm.import_key({**base, "PYTHONHASHSEED": "0"})


def test_without_a_server_the_job_runs_in_process_and_a_server_starts_for_the_next(warm_env, empty_project):
    plain = subprocess.run([sys.executable, "-m", "hnclip", "runs"], env=warm_env, capture_output=True,
                           text=True, cwd=empty_project)
    assert plain.returncode == 0 and plain.stdout, plain.stderr
    first = subprocess.run([sys.executable, "-m", "hnclip.runtime.warm", "runs"], env=warm_env,
                           capture_output=True, text=True, cwd=empty_project, timeout=120)
    assert (first.returncode, first.stdout) == (0, plain.stdout), first.stderr
    path = _socket_for({**warm_env, "OMP_WAIT_POLICY": warm_env.get("OMP_WAIT_POLICY", "PASSIVE")})
    assert _wait_for(path.exists, timeout=90), "no server started in the background"
    second = subprocess.run([sys.executable, "-m", "hnclip.runtime.warm", "runs"], env=warm_env,
                            capture_output=True, text=True, cwd=empty_project, timeout=120)
    assert (second.returncode, second.stdout) == (0, plain.stdout), second.stderr
    assert _wait_for(lambda: not path.exists(), timeout=30), "the idle server did not exit"


def test_user_errors_keep_their_exit_status(warm_env, empty_project):
    for env in (warm_env, {**warm_env, warm.DISABLE_ENV: "0"}):
        proc = subprocess.run([sys.executable, "-m", "hnclip.runtime.warm", "--profile", "nosuch", "runs"],
                              env=env, capture_output=True, text=True, cwd=empty_project, timeout=120)
        assert proc.returncode == 2 and "nosuch" in proc.stderr


def test_a_shared_directory_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="private"):
        warm.socket_path({warm.DIR_ENV: str(shared)})


def test_a_socket_deeper_than_the_address_limit_is_bound_and_reached(tmp_path):
    """AF_UNIX addresses hold about 107 bytes; a deep HNCLIP_WARM_DIR (a test's tmp_path, a long home) is
    reached through a descriptor of its directory, and the socket file appears where the path says."""
    import socket
    directory = tmp_path / ("d" * 60) / ("e" * 60)
    directory.mkdir(parents=True)
    path = directory / "key.sock"
    assert len(str(path)) > 110
    with pytest.raises(OSError, match="too long"):
        socket.socket(socket.AF_UNIX).bind(str(path))
    listener, client = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        with warm.socket_address(path) as address:
            listener.bind(address)
        listener.listen(1)
        assert path.is_socket()
        with warm.socket_address(path) as address:
            client.connect(address)
        conn, _ = listener.accept()
        client.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.close()
    finally:
        listener.close()
        client.close()
    with warm.socket_address(Path("/tmp/hnclip-warm-0/key.sock")) as address:
        assert address == "/tmp/hnclip-warm-0/key.sock"  # a short path is used as it is
