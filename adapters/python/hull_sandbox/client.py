"""A client of hull's session API (docs/api.md) over its unix socket, and
the `hull serve` process an adapter starts when it is given no socket.

Standard library only: the adapters add no dependency of their own.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from typing import Any


class HullError(Exception):
    """A refusal of the API: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"hull: {status}: {message}")
        self.status = status
        self.message = message


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("hull", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


class Client:
    """One caller of `hull serve` at `socket_path`."""

    def __init__(self, socket_path: str, timeout: float | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> bytes:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            headers = {"content-type": content_type} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data.decode("utf-8", "replace")
            raise HullError(resp.status, message)
        return data

    def _json(self, method: str, path: str, doc: dict[str, Any] | None = None) -> Any:
        body = None if doc is None else json.dumps(doc).encode()
        data = self.request(method, path, body)
        return json.loads(data) if data else None

    def create(
        self,
        tier: str,
        project: str | None,
        policy: str = "default",
        workspace: str = "shared",
    ) -> dict[str, Any]:
        """Opens a session. `project` may be None with workspace "copy" (an
        empty workspace of hull's)."""
        doc: dict[str, Any] = {"tier": tier, "policy": policy, "workspace": workspace}
        if project is not None:
            doc["project"] = project
        return self._json("POST", "/v1/sessions", doc)

    def changes(self, session: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/sessions/{session}/changes")

    def exec(
        self,
        session: str,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout: str | None = None,
        max_output: int | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        doc: dict[str, Any] = {"argv": argv}
        if user is not None:
            doc["user"] = user
        if cwd:
            doc["cwd"] = cwd
        if env:
            doc["env"] = env
        if isinstance(stdin, bytes):
            doc["stdin_base64"] = base64.b64encode(stdin).decode("ascii")
        elif stdin is not None:
            doc["stdin"] = stdin
        if timeout is not None:
            doc["timeout"] = timeout
        if max_output is not None:
            doc["max_output"] = max_output
        return self._json("POST", f"/v1/sessions/{session}/exec", doc)

    def read(self, session: str, path: str, max_bytes: int | None = None) -> bytes:
        q = {"path": path}
        if max_bytes is not None:
            q["max_bytes"] = str(max_bytes)
        return self.request(
            "GET", f"/v1/sessions/{session}/files?{urllib.parse.urlencode(q)}"
        )

    def write(self, session: str, path: str, data: bytes) -> None:
        q = urllib.parse.urlencode({"path": path})
        self.request(
            "PUT",
            f"/v1/sessions/{session}/files?{q}",
            data,
            "application/octet-stream",
        )

    def close(self, session: str) -> None:
        self.request("DELETE", f"/v1/sessions/{session}")


def hull_executable(explicit: str | None = None) -> str:
    """The hull to run: `explicit`, else $HULL_BIN, else `hull` on PATH."""
    found = explicit or os.environ.get("HULL_BIN") or shutil.which("hull")
    if not found:
        raise RuntimeError(
            "hull: no hull executable (give `hull` in the config, set HULL_BIN, "
            "or put hull on PATH)"
        )
    return found


class Server:
    """A `hull serve` of the adapter's own, on a socket in a private
    directory; `stop()` (SIGTERM) closes its sessions and ends it."""

    def __init__(self, hull: str | None = None, start_timeout: float = 30) -> None:
        self._dir = tempfile.mkdtemp(prefix="hull-serve-")
        self.socket_path = os.path.join(self._dir, "s", "serve.sock")
        # Its messages go to a file: a pipe nobody reads would fill.
        self.log = os.path.join(self._dir, "serve.log")
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                [hull_executable(hull), "serve", "--socket", self.socket_path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + start_timeout
        while True:
            if self._proc.poll() is not None:
                with open(self.log, "rb") as f:
                    err = f.read().decode("utf-8", "replace")
                shutil.rmtree(self._dir, ignore_errors=True)
                raise RuntimeError(f"hull serve ended before it listened: {err.strip()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket_path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("hull serve did not listen in time")
                time.sleep(0.02)

    def stop(self, timeout: float = 120) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)
