"""Helpers of the tests/system/ fault and safety tests (issue 12): a real HTTP server in a thread."""

from __future__ import annotations

import base64
import contextlib
import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator


class _Handler(SimpleHTTPRequestHandler):
    """Python's own file server (no Range support, like `python -m http.server`), with optional Basic auth."""

    auth: str | None = None
    stats: dict | None = None

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _allowed(self) -> bool:
        if self.auth is None:
            return True
        expected = "Basic " + base64.b64encode(self.auth.encode()).decode()
        if self.headers.get("Authorization") == expected:
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="x"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.stats is not None:
            self.stats["gets"] = self.stats.get("gets", 0) + 1
        if self._allowed():
            super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        if self._allowed():
            super().do_HEAD()


@contextlib.contextmanager
def serve_directory(directory: Path, auth: str | None = None, stats: dict | None = None) -> Iterator[str]:
    """Serve `directory` on 127.0.0.1; yields the base URL. `auth` "user:password" requires Basic auth;
    `stats` (a dict) counts the GETs served under "gets"."""
    handler = type("Handler", (_Handler,), {"auth": auth, "stats": stats})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    server.handle_error = lambda *args: None  # a client closing early (a Range probe) is not an error here
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
