"""A headless Chromium driven over the DevTools protocol, with nothing but the standard library.

Why not `chromium --dump-dom` once per page: each start costs a second or two of a busy core,
and the site has two dozen pages. One browser, told where to go and what to evaluate over its
websocket, visits them all in a few seconds. The websocket client below is the smallest that
the protocol needs: a client handshake, masked text frames out, unmasked frames in (RFC 6455).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None

# What no test opens: the site's search index (see Browser.__init__). Its worker still starts,
# and with nothing to read it builds nothing.
BLOCKED = ("*/search/search_index.json",)


class Browser:
    """One headless Chromium with one tab; ``open(url)`` then ``evaluate(js)``."""

    def __init__(self, width: int = 1280, height: int = 800, timeout: float = 30.0):
        self.profile = tempfile.mkdtemp(prefix="minitron-chromium-")
        self.timeout = timeout
        self.process = subprocess.Popen(
            [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--hide-scrollbars=false", f"--window-size={width},{height}", f"--user-data-dir={self.profile}",
             # Offline and quick: a request for a web font fails at once instead of waiting on DNS,
             # and the page falls back to the system fonts of the same widths (see the test).
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             "--remote-debugging-port=0", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port = self._port()
            target = json.loads(_http_get(port, "/json/list"))
            page = next(t for t in target if t["type"] == "page")
            self.sock = _ws_connect(port, "/" + page["webSocketDebuggerUrl"].split("/", 3)[3])
            self.next_id, self._events = 0, []  # events that arrive while a call waits
            self.call("Page.enable")
            # The site's search index never loads: Material fetches it (1.5 MB of JSON) and
            # builds a search index from it in a web worker on every page it opens, 0.6 s of a
            # core per page and two thirds of a visit of the whole site (37.7 s of CPU against
            # 13.4 s without, 42 pages), and no test here measures search. Layout is the same
            # either way: page_metrics.js counted the same on every page with and without it.
            self.call("Network.enable")
            self.call("Network.setBlockedURLs", urls=list(BLOCKED))
        except BaseException:
            self.close()
            raise

    def _port(self) -> int:
        """The port Chromium chose: it writes it to DevToolsActivePort in its profile."""
        active = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if active.exists() and active.read_text().strip():
                return int(active.read_text().split()[0])
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.process.returncode} before listening")
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        mine = self.next_id
        _ws_send(self.sock, json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            message = json.loads(_ws_receive(self.sock))
            if message.get("id") == mine:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def open(self, url: str) -> None:
        """Go to ``url`` and wait for its load event and its fonts (layout depends on both)."""
        self._events = []
        self.call("Page.navigate", url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._events.append(json.loads(_ws_receive(self.sock)))
        self.evaluate("document.fonts.ready.then(() => true)")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page's script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def _http_get(port: int, path: str) -> str:
    """A GET of the DevTools HTTP endpoint; it keeps the connection open, so read by length."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        return (body + _read(sock, length - len(body))).decode()


def _ws_connect(port: int, path: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(1)  # byte by byte: what follows the headers is the first frame
    if b" 101 " not in reply.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"no websocket: {reply[:80]!r}")
    return sock


def _ws_send(sock: socket.socket, text: str) -> None:
    payload, mask = text.encode(), os.urandom(4)  # a client must mask what it sends
    size = len(payload)
    header = bytes([0x81]) + (bytes([0x80 | size]) if size < 126 else
                              bytes([0x80 | 126]) + struct.pack(">H", size) if size < 65536 else
                              bytes([0x80 | 127]) + struct.pack(">Q", size))
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def _ws_receive(sock: socket.socket) -> str:
    """One whole message (continuation frames joined); the server's frames are not masked."""
    message = b""
    while True:
        first, second = _read(sock, 2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack(">H", _read(sock, 2))[0]
        elif size == 127:
            size = struct.unpack(">Q", _read(sock, 8))[0]
        message += _read(sock, size)
        if first & 0x80:  # FIN
            return message.decode()


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError("chromium closed the connection")
        data += chunk
    return data
