"""Outbound HTTP(S) for isolated workers: a proxy on a private Unix socket.

Workers in a loopback-only namespace cannot reach the network, but scripts
download datasets and weights (``keras.utils.get_file``, TFDS, ``urllib``).
They get ``HTTPS_PROXY``/``HTTP_PROXY`` = ``http://127.0.0.1:<relay port>``;
the namespace holder relays those connections to this proxy, which runs in
the launcher (outside the namespace) and listens on a Unix socket in a
private (0700) folder: nothing is reachable from the network. It speaks
``CONNECT host:port`` (HTTPS, the common case) and absolute-URI requests
(plain HTTP). When the launcher itself has ``HTTPS_PROXY``/``HTTP_PROXY``,
the bytes go to that proxy unchanged.

Example:
    >>> proxy = EgressProxy("/tmp/mk-egress-test.sock")   # doctest: +SKIP
    >>> proxy.start(); proxy.close()                         # doctest: +SKIP
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
from typing import Mapping

_MAX_HEAD = 65536


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either side ends, then shut both down."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _read_head(conn: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk or len(head) > _MAX_HEAD:
            raise ConnectionError("incomplete request head")
        head += chunk
    return head


def _host_port(authority: str, default: int) -> tuple[str, int]:
    parsed = urllib.parse.urlsplit("//" + authority)
    return parsed.hostname or "", parsed.port or default


class EgressProxy:
    """The launcher-side proxy; one thread per connection, daemon threads only.

    Args:
        path: the Unix socket to listen on (its folder should be private).
        env: where upstream proxies are read (``HTTPS_PROXY``, ``HTTP_PROXY``,
            either case). Defaults to ``os.environ``.
    """

    def __init__(self, path: str, env: Mapping[str, str] | None = None) -> None:
        self.path = path
        env = os.environ if env is None else env
        self._upstream = {scheme: env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
                          for scheme in ("https", "http")}
        self._server: socket.socket | None = None

    def start(self) -> None:
        """Listen and serve in a background thread."""
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        os.chmod(self.path, 0o600)
        server.listen(64)
        self._server = server
        threading.Thread(target=self._serve, name="mirrorkit-egress", daemon=True).start()

    def close(self) -> None:
        """Stop listening (connections in flight end with their peers)."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def _serve(self) -> None:
        server = self._server
        while server is not None:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            head = _read_head(conn)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            upstream_url = self._upstream["https" if method == "CONNECT" else "http"]
            if upstream_url:
                host, port = _host_port(urllib.parse.urlsplit(upstream_url).netloc, 3128)
                remote = socket.create_connection((host, port), timeout=30)
                remote.sendall(head)
            elif method == "CONNECT":
                remote = socket.create_connection(_host_port(target, 443), timeout=30)
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                url = urllib.parse.urlsplit(target)
                remote = socket.create_connection(_host_port(url.netloc, 80), timeout=30)
                path = urllib.parse.urlunsplit(("", "", url.path or "/", url.query, ""))
                first, rest = head.split(b"\r\n", 1)
                remote.sendall(f"{method} {path} {first.decode('latin-1').rsplit(' ', 1)[1]}"
                               .encode("latin-1") + b"\r\n" + rest)
            remote.settimeout(None)
        except (OSError, ValueError, ConnectionError) as err:
            try:
                conn.sendall(f"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                             f"X-Mirrorkit-Error: {type(err).__name__}\r\n\r\n".encode())
            except OSError:
                pass
            conn.close()
            return
        threading.Thread(target=pump, args=(remote, conn), daemon=True).start()
        pump(conn, remote)
