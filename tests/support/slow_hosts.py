"""Hostile media hosts on loopback: real HTTP servers that answer slowly in each way a fetch can be
held (used by tests/test_media_urls.py at the fetch level and tests/test_security.py end to end).

Paths: `/png` a normal image; `/trickle-length` 200 with Content-Length, then one body byte per
`interval`; `/trickle` the same without Content-Length (the body ends when the connection does);
`/chunked` one one-byte chunk per `interval`; `/stall` the headers, then nothing; `/slow-headers`
the status line, then one header byte per `interval`; `/silent` nothing at all after the request;
`/hop` waits `interval`, then redirects to `/hop` again.
Each connection is served by its own thread until the host is closed.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from typing import Any

from support.images import png_bytes

SLOW_PATHS = ("/trickle-length", "/trickle", "/chunked", "/stall", "/slow-headers", "/silent")


class SlowHost:
    """A threaded loopback HTTP/1.1 server (127.0.0.1) answering per path as the module says."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.stop = threading.Event()
        self.requests: list[str] = []
        host = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(65537).decode("latin-1")
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                path = line.split(" ")[1] if line.count(" ") >= 2 else "/"
                host.requests.append(path)
                try:
                    host.answer(self.connection, path)
                except OSError:
                    pass  # the client gave up: what a slow host sees

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _drip(self, sock: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self.stop.wait(self.interval):
                return
            sock.sendall(data[i:i + 1])

    def answer(self, sock: socket.socket, path: str) -> None:
        body = png_bytes(32, 24, (200, 40, 40))
        if path == "/png":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
        elif path == "/trickle-length":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: %d\r\n\r\n" % len(body))
            self._drip(sock, body)
        elif path == "/trickle":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n")
            self._drip(sock, body)
        elif path == "/chunked":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n")
            for byte in body:
                if self.stop.wait(self.interval):
                    return
                sock.sendall(b"1\r\n" + bytes((byte,)) + b"\r\n")
        elif path == "/stall":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: %d\r\n\r\n" % len(body))
            self.stop.wait()
        elif path == "/slow-headers":
            sock.sendall(b"HTTP/1.1 200 OK\r\n")
            self._drip(sock, b"Content-Type: image/png\r\n" * 100 + b"\r\n")
        elif path == "/hop":
            if not self.stop.wait(self.interval):
                sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: /hop\r\nContent-Length: 0\r\n\r\n")
        elif path == "/silent":
            self.stop.wait()
        else:
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> SlowHost:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
