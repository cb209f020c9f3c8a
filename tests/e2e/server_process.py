"""A real `tmt serve` process on a free loopback port, and a small JSON client for it.

Every wait is bounded: start-up, each request, and the shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

START_TIMEOUT = 120        # seconds: loading torch and the model on a busy machine
REQUEST_TIMEOUT = 60


class JsonClient:
    """Requests to a server at `url` (http://host:port), JSON in and out."""

    def __init__(self, url: str):
        self.url = url

    def request(self, path: str, body: Any = None, raw: bytes | None = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """(status, parsed JSON or text) of GET path (no body) or POST path."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                status, payload = response.status, response.read()
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            status, payload, kind = error.code, error.read(), error.headers.get("Content-Type", "")
        return status, json.loads(payload) if "json" in kind else payload.decode()

    def translate(self, **body: Any) -> dict:
        status, answer = self.request("/translate", body)
        assert status == 200, answer
        return answer


class TmtServer(JsonClient):
    """`tmt serve ARGS --port 0`: the port the server picked is read from its stderr."""

    def __init__(self, *args: str):
        super().__init__("")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "transformer_mt", "serve", "--port", "0", *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.stderr_lines: list[str] = []
        listening = threading.Event()

        def read_stderr() -> None:
            for line in self.process.stderr:
                self.stderr_lines.append(line)
                found = re.search(r"listening on (http://127\.0\.0\.1:\d+)/", line)
                if found:
                    self.url = found.group(1)
                    listening.set()

        self._reader = threading.Thread(target=read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not listening.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("tmt serve did not start:\n" + "".join(self.stderr_lines))

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then wait for the exit; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
