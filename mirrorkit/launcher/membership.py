"""Who is still in an elastic job: the pure decision, no processes, no sockets.

A job starts with every worker of ``LaunchSpec.world_size``, known from then
on by its *original rank*. After each failed attempt :class:`Membership`
decides the next attempt's members and renumbers them ``0..K-1`` in
original-rank order (so the lowest surviving original rank is the chief):

* a worker is **lost** when it is the first to fail in two attempts in a row
  (it failed again right after the restart meant to cure it), or when its
  host did not report to the rendezvous in time (multi-node, see
  :mod:`mirrorkit.launcher.rendezvous`);
* with at least ``min_workers`` left, the job continues without the lost
  workers; below that it ends, naming every lost worker;
* membership only shrinks within one job: a lost worker never rejoins (to
  grow back, launch the job again; it resumes from its backup).

Without ``min_workers`` nothing is ever lost: every restart runs all workers,
as plain ``mirrorkit launch --max-restarts`` always did.

Example:
    >>> m = Membership(world=3, min_workers=2)
    >>> m.first_view().members
    (0, 1, 2)
    >>> gone = Blame(original_rank=2, rank=2, address="localhost:23411",
    ...              cause="killed by SIGKILL")
    >>> m.decide(m.first_view(), gone).view.members      # first failure: a suspect
    (0, 1, 2)
    >>> d = m.decide(View(1, (0, 1, 2)), gone)            # again, right after: lost
    >>> d.line
    'mirrorkit: worker 2 (localhost:23411) lost: killed by SIGKILL twice; continuing with 2 of 3 workers (min 2)'
    >>> d.view.members
    (0, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from mirrorkit.errors import RunError


@dataclasses.dataclass(frozen=True)
class View:
    """One attempt's members: what every launcher of the job agrees on.

    Attributes:
        attempt: the restart count (0 for the first attempt).
        members: original ranks, in new-rank order: ``members[r]`` runs as rank ``r``.
        reason: why this attempt started (``MIRRORKIT_RESTART_REASON``); None for the first.

    Example:
        >>> View(1, (0, 2)).rank_of(2)
        1
    """

    attempt: int
    members: tuple[int, ...]
    reason: str | None = None

    def rank_of(self, original_rank: int) -> int:
        """The rank original worker ``original_rank`` runs as in this attempt."""
        return self.members.index(original_rank)

    def to_dict(self) -> dict:
        """JSON-ready form (the rendezvous sends it)."""
        return {"attempt": self.attempt, "members": list(self.members), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict) -> "View":
        """The inverse of :meth:`to_dict`."""
        return cls(int(data["attempt"]), tuple(int(m) for m in data["members"]),
                   data.get("reason"))


@dataclasses.dataclass(frozen=True)
class Blame:
    """A worker held responsible for a failed attempt, and why.

    Attributes:
        original_rank: its rank in the job's first attempt.
        rank: its rank in the failed attempt.
        address: its ``host:port`` in the failed attempt.
        cause: what happened, e.g. ``"killed by SIGKILL"``.

    Example:
        >>> Blame(2, 1, "hostc:23400", "exited with code 1").who()
        'worker 1 (original rank 2, hostc:23400)'
    """

    original_rank: int
    rank: int
    address: str
    cause: str

    def who(self) -> str:
        """``worker R (host:port)``, with the original rank when renumbering changed it."""
        original = (f"original rank {self.original_rank}, "
                    if self.original_rank != self.rank else "")
        return f"worker {self.rank} ({original}{self.address})"

    def to_dict(self) -> dict:
        """JSON-ready form (a launcher reports it to the rendezvous)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Blame":
        """The inverse of :meth:`to_dict`."""
        return cls(int(data["original_rank"]), int(data["rank"]), str(data["address"]),
                   str(data["cause"]))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What follows a failed attempt.

    Attributes:
        view: the next attempt's members, or None when the job cannot continue.
        line: the one-line membership change, when workers were lost.
        failed: the one-line reason the job ends, when ``view`` is None.
    """

    view: View | None
    line: str | None = None
    failed: str | None = None


class Membership:
    """The members of one job across its attempts, and the lost-worker rule.

    Args:
        world: workers in the first attempt (over all nodes).
        min_workers: fewest workers the job may continue with; None (the
            default) turns the rule off: every attempt runs every worker.

    Example:
        >>> Membership(world=2).first_view()
        View(attempt=0, members=(0, 1), reason=None)
    """

    def __init__(self, world: int, min_workers: int | None = None) -> None:
        self.world = world
        self.min_workers = min_workers
        self.lost: list[Blame] = []
        # The first failure of the previous attempt: a second one in a row is a loss.
        self._suspect: Blame | None = None

    def first_view(self, missing: Sequence[Blame] = ()) -> View:
        """The first attempt's view: every worker, minus any that never showed up.

        Raises:
            RuntimeError: when ``missing`` leaves fewer than ``min_workers``.
        """
        view = View(0, tuple(range(self.world)))
        if not missing:
            return view
        decision = self._drop(view, list(missing))
        if decision.view is None:
            raise RunError(decision.failed)
        return dataclasses.replace(decision.view, attempt=0, reason=None)

    def decide(self, view: View, blamed: Blame | None, missing: Sequence[Blame] = (),
               phrase: str | None = None) -> Decision:
        """The next attempt after ``view`` failed.

        Args:
            view: the attempt that failed.
            blamed: the worker that failed first (None when unknown, or when a
                missing host explains the failure).
            missing: workers whose host did not report in time: lost at once.
            phrase: the root cause in words, used as the next attempt's
                reason when membership does not change. Defaults to
                ``blamed``'s account.

        Returns:
            A :class:`Decision`; the next view has ``attempt = view.attempt + 1``.
        """
        lost = list(missing)
        suspect, self._suspect = self._suspect, None
        if self.min_workers is not None and blamed is not None and not missing:
            if suspect is not None and suspect.original_rank == blamed.original_rank:
                twice = (f"{blamed.cause} twice" if suspect.cause == blamed.cause
                         else f"{suspect.cause}, then {blamed.cause}")
                lost.append(dataclasses.replace(blamed, cause=twice))
            else:
                self._suspect = blamed
        if phrase is None and blamed is not None:
            phrase = f"{blamed.who()} {blamed.cause}"
        reason = f"attempt {view.attempt + 1} failed: {phrase or 'a worker failed'}"
        if not lost:
            return Decision(View(view.attempt + 1, view.members, reason))
        return self._drop(view, lost)

    def _drop(self, view: View, lost: list[Blame]) -> Decision:
        gone = {b.original_rank for b in lost}
        members = tuple(m for m in view.members if m not in gone)
        self.lost.extend(lost)
        if len(members) < (self.min_workers or self.world):
            named = "; ".join(f"{b.who()}: {b.cause}" for b in self.lost)
            return Decision(None, failed=(
                f"mirrorkit: too few workers left: {len(members)} of {self.world}, "
                f"below --min-workers {self.min_workers or self.world}; lost: {named}"))
        chief = ""
        if members[0] != view.members[0]:
            chief = f"; original worker {members[0]} is the new chief (rank 0)"
        line = ("mirrorkit: " + "; ".join(f"{b.who()} lost: {b.cause}" for b in lost)
                + f"; continuing with {len(members)} of {self.world} workers "
                f"(min {self.min_workers}){chief}")
        return Decision(View(view.attempt + 1, members, line), line=line)


class LocalAgreement:
    """One machine (or multi-node without ``min_workers``): this launcher alone decides.

    The same methods as :class:`~mirrorkit.launcher.rendezvous.RendezvousClient`,
    so the agent's loop does not care which it has.

    Example:
        >>> agreement = LocalAgreement(world=2)
        >>> agreement.after_failure(agreement.first_view(), None, False).view.members
        (0, 1)
    """

    def __init__(self, world: int, min_workers: int | None = None) -> None:
        self.membership = Membership(world, min_workers)

    def first_view(self) -> View:
        """Every worker."""
        return self.membership.first_view()

    def stop_requested(self, attempt: int) -> bool:
        """Never: no other launcher can fail first."""
        return False

    def after_failure(self, view: View, blame: Blame | None, peer_loss: bool) -> Decision:
        """The next attempt (see :meth:`Membership.decide`)."""
        return self.membership.decide(view, blame)

    def finished(self) -> None:
        """Nothing to tell anyone."""

    def close(self) -> None:
        """Nothing to close."""
