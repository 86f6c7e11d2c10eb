"""A local HTTP server that injects faults, for download tests (the `server` fixture in conftest.py
starts one per test).

It serves `/<source>/<file>` with Range support and a per-path queue of faults, each consumed by
one GET:
  "500"       HTTP 500, no body
  "429"       HTTP 429 with Retry-After: 3
  "truncate"  sends `cut` bytes of a body announced longer, then closes the connection cleanly
  "drop"      sends `cut` bytes, then resets the connection (RST) mid-body
  "wrong"     sends different bytes of the same length (checksum mismatch)
A path in `ignore_range` always answers 200 with the full body. `add_hub` serves a file the way the
Hugging Face Hub does (`/[datasets/]<repo>/resolve/<commit>/<file>`, HEAD and GET, with the
X-Repo-Commit and ETag headers hf_hub_download requires).
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from helpers.payloads import sha256
from hnclip.rehearsal.server import byte_range

FAST = dict(backoff=0.001, progress=False)  # tiny backoff keeps the retry tests quick


@dataclass
class Served:
    path: str
    range: str | None
    status: int
    sent: int
    method: str = "GET"


@dataclass
class FaultServer:
    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    ignore_range: set[str] = field(default_factory=set)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # extra response headers per path
    cut: int = 1 << 19   # bytes sent before a truncation or drop (a multiple of the client's read size)
    log: list[Served] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, data: bytes, faults: list[str] = ()) -> str:
        """Serve `data` at `path` ('/<source>/<file>'); returns the full URL."""
        self.files[path] = data
        self.faults[path] = list(faults)
        return self.url + path

    def add_hub(self, repo_id: str, commit: str, name: str, data: bytes, faults: list[str] = (),
                repo_type: str = "model") -> str:
        """Serve `data` as the Hub serves `name` of `repo_id` at `commit`; returns the path."""
        path = f"{'/datasets' if repo_type == 'dataset' else ''}/{repo_id}/resolve/{commit}/{name}"
        self.headers[path] = {"X-Repo-Commit": commit, "ETag": f'"{sha256(data)}"'}
        self.add(path, data, faults)
        return path

    def next_fault(self, path: str) -> str | None:
        with self.lock:
            queue = self.faults.get(path)
            return queue.pop(0) if queue else None

    def record(self, served: Served) -> None:
        with self.lock:
            self.log.append(served)

    def served(self, path: str, method: str = "GET") -> list[Served]:
        with self.lock:
            return [entry for entry in self.log if entry.path == path and entry.method == method]


class FaultHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    @property
    def state(self) -> FaultServer:
        return self.server.state

    def do_HEAD(self) -> None:
        path = self.path.split("?")[0]
        data = self.state.files.get(path)
        if data is None:
            return self._empty(path, None, 404, method="HEAD")
        self.state.record(Served(path, None, 200, 0, "HEAD"))
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self._extra_headers(path)
        self.end_headers()

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        requested_range = self.headers.get("Range")
        data = self.state.files.get(path)
        fault = self.state.next_fault(path)
        if data is None:
            return self._empty(path, requested_range, 404)
        if fault == "500":
            return self._empty(path, requested_range, 500)
        if fault == "429":
            return self._empty(path, requested_range, 429, {"Retry-After": "3"})
        body = bytes(b ^ 0xFF for b in data) if fault == "wrong" else data
        honoured = None if path in self.state.ignore_range else requested_range
        status, start, range_headers = byte_range(honoured, len(body))  # as the rehearsal's mirror answers
        if status == 416:
            return self._empty(path, requested_range, 416, range_headers)
        payload = body[start:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Accept-Ranges", "bytes")
        for key, value in range_headers.items():
            self.send_header(key, value)
        self._extra_headers(path)
        self.end_headers()
        interrupted = fault in ("truncate", "drop")
        sent = min(self.state.cut, len(payload) - 1) if interrupted else len(payload)
        self.state.record(Served(path, requested_range, status, sent))  # before the client can finish
        self.wfile.write(payload[:sent])
        if fault == "drop":
            time.sleep(0.2)  # let the client take what was sent, then reset the connection
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    def _empty(self, path: str, requested_range: str | None, status: int, headers: dict | None = None,
               method: str = "GET") -> None:
        self.state.record(Served(path, requested_range, status, 0, method))
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _extra_headers(self, path: str) -> None:
        for key, value in self.state.headers.get(path, {}).items():
            self.send_header(key, value)


@contextmanager
def running_server() -> Iterator[FaultServer]:
    """A FaultServer on a free local port, shut down on exit."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FaultHandler)
    httpd.state = FaultServer(url=f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield httpd.state
    finally:
        httpd.shutdown()
        httpd.server_close()
