"""Multi-node elastic jobs: the launchers agree on who is still there.

After torchrun's c10d rendezvous, one launcher hosts it: node 0's, on the
port after its workers' (``LaunchSpec.rendezvous_address``; for ``--hosts
a,b,c --port 23400 -n 1`` that is ``a:23401``). Every launcher, node 0's
too, is a :class:`RendezvousClient` speaking JSON lines over one TCP
connection (standard library only; like TensorFlow's own traffic it is
unauthenticated, so it belongs on the same private network):

1. ``join``: each node says it is up. When all have joined (or the join
   timeout passed: nodes still missing are lost), the host sends everyone
   the first :class:`~mirrorkit.launcher.membership.View`.
2. While an attempt runs, a node whose workers fail stops them and sends a
   ``report`` (who failed first, how, and whether that worker only saw a
   lost peer). The host at once tells the others to ``stop`` theirs, waits
   until every node of the attempt reported or ``rendezvous_timeout``
   seconds passed (a node still silent then, or whose connection closed, is
   lost with all its workers), applies the lost-worker rule of
   :class:`~mirrorkit.launcher.membership.Membership`, and sends every node
   the same next view (ranks renumbered) or the line that ends the job.
3. ``done``: a node whose workers all finished says so and leaves.

**When the host itself is lost**, the others cannot agree on anything
without it, so there is no successor: each remaining launcher stops its
workers and fails with one line naming node 0's host and the rendezvous
address (``lost the rendezvous at a:23401 (node 0, host a)``). Keep node 0 on
the most reliable machine.

Example:
    >>> spec = LaunchSpec(command=("python", "t.py"), nproc=1, hosts=("a", "b", "c"),
    ...                   port=23400, node_rank=1, min_workers=2, max_restarts=2)
    >>> client = RendezvousClient(spec, threading.Event())       # doctest: +SKIP
    >>> client.first_view().members                              # doctest: +SKIP
    (0, 1, 2)
"""

from __future__ import annotations

import json
import logging
import queue
import selectors
import socket
import threading
import time
from typing import Callable

from mirrorkit import _env
from mirrorkit.errors import RunError, UserInputError
from mirrorkit.launcher.membership import Blame, Decision, Membership, View
from mirrorkit.launcher.spec import LaunchSpec
from mirrorkit.protocol import DEFAULT_JOIN_TIMEOUT

logger = logging.getLogger(__name__)

# Extra seconds a node waits for the host's answer beyond the host's own deadline.
_ANSWER_SLACK = 10.0


def _send(sock: socket.socket, message: dict) -> bool:
    try:
        sock.sendall((json.dumps(message) + "\n").encode())
        return True
    except OSError:
        return False


class RendezvousServer:
    """The rendezvous node 0's launcher hosts, in a thread of its own.

    Args:
        spec: the job (every launcher was given the same ``hosts``,
            ``nproc``, ``min_workers`` and ``rendezvous_timeout``).
        join_timeout: seconds to wait for every node to join the first attempt.

    Raises:
        UserInputError: when the rendezvous port is in use on this machine.
    """

    def __init__(self, spec: LaunchSpec, join_timeout: float) -> None:
        self._spec = spec
        self._membership = Membership(spec.world_size, spec.min_workers)
        self._addresses = spec.node_addresses()
        port = spec.rendezvous_address()[1]
        try:
            self._listener = socket.create_server(("", port))
        except OSError as err:
            raise UserInputError(f"The rendezvous port {port} is in use on this machine "
                                 f"({err.strerror}): choose another --port.") from err
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._buffers: dict[socket.socket, bytes] = {}
        self._nodes: dict[int, socket.socket] = {}
        self._view: View | None = None
        self._reports: dict[int, dict] = {}
        self._gone: set[int] = set()
        self._deadline: float | None = time.monotonic() + join_timeout
        self._over = False   # the job ended: nothing left to agree on
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="mirrorkit-rendezvous",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._closed.set()
        self._thread.join(5.0)

    # --- the loop ---------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._closed.is_set():
                for key, _ in self._selector.select(timeout=0.2):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.fileobj)
                if self._deadline is not None and time.monotonic() > self._deadline:
                    self._decide()
        finally:
            for sock in [*self._buffers, self._listener]:
                sock.close()
            self._selector.close()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        conn.setblocking(True)
        conn.settimeout(5.0)  # only for sends: reads go through the selector
        self._buffers[conn] = b""
        self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        self._buffers[conn] += data
        *lines, self._buffers[conn] = self._buffers[conn].split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
                node = int(message["node"])
                if 0 <= node < self._spec.nnodes:
                    self._handle(conn, node, message)
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                # Not one of ours: ignore it rather than end the job's agreement.
                logger.debug("rendezvous: ignored a malformed message (%s)", err)

    def _drop(self, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        self._buffers.pop(conn, None)
        conn.close()
        for node, sock in list(self._nodes.items()):
            if sock is conn:
                del self._nodes[node]
                # A launcher that closed without `done` died, and its workers with it.
                if not self._over and node in self._member_nodes():
                    self._gone.add(node)
                    self._failed_attempt(node)

    # --- the protocol -----------------------------------------------------

    def _member_nodes(self) -> set[int]:
        members = self._view.members if self._view is not None else ()
        return {m // self._spec.nproc for m in members}

    def _handle(self, conn: socket.socket, node: int, message: dict) -> None:
        op = message.get("op")
        if self._over:
            return
        if op == "join":
            if self._view is not None:
                _send(conn, {"op": "fail", "line": (
                    f"mirrorkit: node {node} joined after the job started; membership only "
                    "shrinks within one job, so it continues without this node")})
                return
            self._nodes[node] = conn
            if len(self._nodes) == self._spec.nnodes:
                self._decide()
        elif op == "report" and self._view is not None:
            if message.get("attempt") == self._view.attempt:
                self._reports[node] = message
                self._failed_attempt(node)
            else:   # decided without it: say so rather than leave it waiting
                _send(conn, {"op": "fail", "line": (
                    f"mirrorkit: node {node} reported after the rendezvous timeout "
                    f"({self._spec.rendezvous_timeout:g} s); the job continues without it")})
        elif op == "done":
            self._gone.discard(node)
            self._nodes.pop(node, None)

    def _failed_attempt(self, node: int) -> None:
        if self._deadline is None:
            # The first news of a failure: everyone else stops now, not at
            # their own heartbeat timeout.
            self._deadline = time.monotonic() + self._spec.rendezvous_timeout
            for other, sock in self._nodes.items():
                if other != node:
                    _send(sock, {"op": "stop", "attempt": self._view.attempt, "node": node})
        if self._member_nodes() <= set(self._reports) | self._gone:
            self._decide()

    def _lost_nodes(self, nodes: set[int], why: str) -> list[Blame]:
        view = self._view or View(0, tuple(range(self._spec.world_size)))
        return [Blame(m, view.rank_of(m), self._addresses[m],
                      f"host {self._addresses[m].rsplit(':', 1)[0]} {why}")
                for m in view.members if m // self._spec.nproc in nodes]

    def _decide(self) -> None:
        self._deadline = None
        if self._view is None:
            missing = set(range(self._spec.nnodes)) - set(self._nodes)
            try:
                view = self._membership.first_view(self._lost_nodes(
                    missing, "did not join the rendezvous in time"))
                self._view = view
                decision = Decision(view, line=None)
            except RuntimeError as err:
                decision = Decision(None, failed=str(err))
                self._over = True
            self._answer(set(self._nodes), decision)
            return
        silent = self._member_nodes() - set(self._reports)
        gone, late = silent & self._gone, silent - self._gone
        missing = (self._lost_nodes(gone, "lost its launcher") + self._lost_nodes(
            late, f"did not report within {self._spec.rendezvous_timeout:g} s"))
        blames = [(r.get("at", 0.0), not r.get("peer_loss"), Blame.from_dict(r["blame"]))
                  for r in self._reports.values() if r.get("blame")]
        # The root cause: the earliest failure that was not merely a lost peer.
        blamed = None
        if blames and not missing:
            real = [b for b in blames if b[1]] or blames
            blamed = min(real, key=lambda b: b[0])[2]
        decision = self._membership.decide(self._view, blamed, missing)
        self._answer(set(self._reports), decision)
        self._reports, self._gone = {}, set()
        if decision.view is None:
            self._over = True
        else:
            self._view = decision.view

    def _answer(self, nodes: set[int], decision: Decision) -> None:
        if decision.view is None:
            message = {"op": "fail", "line": decision.failed}
        else:
            message = {"op": "view", "view": decision.view.to_dict(), "line": decision.line}
        for node in nodes:
            if node in self._nodes:
                _send(self._nodes[node], message)


class RendezvousClient:
    """One launcher's side of the rendezvous (node 0's also starts the server).

    Args:
        spec: the job; ``spec.node_rank`` is this node.
        wake: set when the host says to stop (another node failed), so the
            agent's monitor loop reacts at once.
        interrupted: polled while waiting for the host; when it returns True
            (the launcher got SIGINT/SIGTERM) the wait ends with no view.

    Raises:
        UserInputError: node 0 only: the rendezvous port is in use.
        RuntimeError: the host did not answer within the join timeout.
    """

    def __init__(self, spec: LaunchSpec, wake: threading.Event,
                 interrupted: Callable[[], bool] = lambda: False) -> None:
        self._spec = spec
        self._wake = wake
        self._interrupted = interrupted
        self._host, self._port = spec.rendezvous_address()
        self._join_timeout = _env.join_timeout() or DEFAULT_JOIN_TIMEOUT
        self._server = (RendezvousServer(spec, self._join_timeout)
                        if spec.node_rank == 0 else None)
        self._answers: queue.Queue[dict | None] = queue.Queue()
        self._stop_attempt: int | None = None
        try:
            self._sock = self._connect()
        except BaseException:
            if self._server is not None:
                self._server.close()
            raise
        self._reader = threading.Thread(target=self._read, name="mirrorkit-rendezvous-client",
                                        daemon=True)
        self._reader.start()

    def _where(self) -> str:
        return f"{self._host}:{self._port} (node 0, host {self._host})"

    def _connect(self) -> socket.socket:
        # Node 0's launcher may start after this one: retry until the join timeout.
        deadline = time.monotonic() + self._join_timeout
        while True:
            try:
                sock = socket.create_connection((self._host, self._port), timeout=5.0)
                sock.settimeout(None)
                _send(sock, {"op": "join", "node": self._spec.node_rank})
                return sock
            except OSError as err:
                if time.monotonic() > deadline or self._interrupted():
                    raise RunError(f"Cannot reach the rendezvous at {self._where()} "
                                   f"within {self._join_timeout:g} s: {err}") from err
                time.sleep(0.5)

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                data = self._sock.recv(65536)
                if not data:
                    break
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    message = json.loads(line)
                    if message.get("op") == "stop":
                        self._stop_attempt = message.get("attempt")
                        self._wake.set()
                    else:
                        self._answers.put(message)
        except (OSError, ValueError):
            pass
        self._answers.put(None)   # the host is gone (or closed after the job)

    def _answer(self, timeout: float) -> Decision:
        deadline = time.monotonic() + timeout
        message = None
        # In short waits, so a Ctrl-C to the launcher is not held up for minutes.
        while not self._interrupted():
            try:
                message = self._answers.get(timeout=min(0.2, max(deadline - time.monotonic(), 0)))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    break
        if self._interrupted():
            return Decision(None, failed="mirrorkit: interrupted while waiting for the rendezvous")
        if message is None:
            return Decision(None, failed=(
                f"mirrorkit: lost the rendezvous at {self._where()}: without its host the "
                "launchers cannot agree on a membership, so this node stops"))
        if message.get("op") == "fail":
            return Decision(None, failed=message.get("line"))
        return Decision(View.from_dict(message["view"]), line=message.get("line"))

    def first_view(self) -> View:
        """Wait until every node joined (or the join timeout); the first attempt's view.

        Raises:
            RuntimeError: the host said the job cannot start, or did not answer.
        """
        decision = self._answer(self._join_timeout + _ANSWER_SLACK)
        if decision.view is None:
            raise RunError(decision.failed)
        return decision.view

    def stop_requested(self, attempt: int) -> bool:
        """Whether the host said another node's workers failed in ``attempt``."""
        return self._stop_attempt == attempt

    def after_failure(self, view: View, blame: Blame | None, peer_loss: bool) -> Decision:
        """Report this node's failed (or stopped) attempt; the next view everyone agreed on.

        Args:
            view: the attempt that failed.
            blame: this node's first failure, None when it was told to stop.
            peer_loss: that worker only reported a lost peer (a consequence).
        """
        sent = _send(self._sock, {
            "op": "report", "node": self._spec.node_rank, "attempt": view.attempt,
            "blame": blame.to_dict() if blame else None, "peer_loss": peer_loss,
            "at": time.time()})
        return self._answer(self._spec.rendezvous_timeout + _ANSWER_SLACK if sent else 0.0)

    def finished(self) -> None:
        """Tell the host this node's workers all succeeded (best effort)."""
        _send(self._sock, {"op": "done", "node": self._spec.node_rank})

    def close(self) -> None:
        """Close the connection (and, on node 0, the server)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._server is not None:
            self._server.close()
