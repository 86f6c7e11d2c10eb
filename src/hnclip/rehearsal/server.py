"""A loopback HTTP server for a folder: what the rehearsal serves its mirror with (and what the
download tests' fault server builds on). GET and HEAD of `/<path>` answer the file under the folder,
with byte ranges (`Range: bytes=<start>-`, 206 / 416) as the downloader's resume asks for them."""
from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

LOOPBACK = "127.0.0.1"


def byte_range(requested: str | None, size: int) -> tuple[int, int, dict[str, str]]:
    """(status, first byte, extra headers) answering a `Range: bytes=<start>-` request for a body of `size`
    bytes: 200 from 0 without one, 206 from `start`, 416 when `start` is at or past the end."""
    if not requested:
        return 200, 0, {}
    start = int(re.match(r"bytes=(\d+)-", requested).group(1))
    if start >= size:
        return 416, start, {"Content-Range": f"bytes */{size}"}
    return 206, start, {"Content-Range": f"bytes {start}-{size - 1}/{size}"}


class FolderHandler(BaseHTTPRequestHandler):
    """Serves the files under `server.folder`; nothing outside it."""

    def log_message(self, *args) -> None:  # quiet: the downloader logs what it fetched
        pass

    def _file(self) -> Path | None:
        folder = self.server.folder
        relative = unquote(self.path.split("?")[0]).lstrip("/")
        path = (folder / relative).resolve()
        if folder not in path.parents or not path.is_file():
            return None
        return path

    def do_HEAD(self) -> None:
        path = self._file()
        if path is None:
            return self._status(404)
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self) -> None:
        path = self._file()
        if path is None:
            return self._status(404)
        data = path.read_bytes()
        status, start, headers = byte_range(self.headers.get("Range"), len(data))
        if status == 416:
            return self._status(416, headers)
        self.send_response(status)
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("Accept-Ranges", "bytes")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data[start:])

    def _status(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def serving(folder: str | Path, port: int = 0) -> Iterator[str]:
    """Serve `folder` on loopback (a free port unless `port`) while the block runs; yields the base URL."""
    httpd = ThreadingHTTPServer((LOOPBACK, port), FolderHandler)
    httpd.folder = Path(folder).resolve()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
