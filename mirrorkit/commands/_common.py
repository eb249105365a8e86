"""Helpers shared by the commands: user errors to one line, mirrorkit's own bugs reported, common options."""

from __future__ import annotations

import contextlib
import logging
import traceback
from typing import IO, Any, Callable, Iterator

import click

from mirrorkit._version import __version__
from mirrorkit.errors import MissingDependency, RunError, UserInputError

# Library errors a user can cause with bad input or environment: one line,
# no traceback. A bare ValueError, RuntimeError or ImportError is not one of
# them: raised inside mirrorkit (an unpacking bug's "too many values to
# unpack") it is a defect (see mirrorkit.errors), reported by bug_reports()
# with its traceback.
USER_ERRORS = (UserInputError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError, RunError, MissingDependency)

# click's own control flow (Exit and Abort are RuntimeErrors) passes untouched.
_CLICK_FLOW = (click.ClickException, click.exceptions.Exit, click.Abort)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's user-facing exceptions into one-line click errors.

    Only :data:`USER_ERRORS` are converted; anything else (a plain
    ``ValueError`` too) propagates to :func:`bug_reports`.

    Example:
        >>> with user_errors():                          # doctest: +SKIP
        ...     raise UserInputError("`epochs` must be a positive integer. Received: epochs=0")
        Error: `epochs` must be a positive integer. Received: epochs=0
    """
    try:
        yield
    except _CLICK_FLOW:
        raise
    except USER_ERRORS as err:
        raise click.ClickException(_one_line(err)) from err


class InternalError(click.ClickException):
    """An exception mirrorkit did not expect: its traceback, then one line asking for a report.

    Exit status 1 (click's failure status; 2 stays the usage error's).

    Example:
        >>> err = InternalError(RuntimeError("step counter went backwards"))
        >>> err.exit_code, err.message.split(". ")[0]
        (1, 'RuntimeError: step counter went backwards')
    """

    exit_code = 1

    def __init__(self, error: BaseException) -> None:
        first = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), "")
        what = f"{type(error).__name__}: {first}" if first else type(error).__name__
        origin = _raised_in(error)
        if origin == "mirrorkit":
            advice = (f"This is a bug in mirrorkit {__version__}: please report it with the "
                      "traceback above and the output of `mirrorkit info --json`.")
        else:
            # TensorFlow's own runtime errors (a corrupt image, out of memory)
            # are often the data's or the machine's, not a defect of ours.
            advice = (f"Raised inside {origin} while mirrorkit {__version__} ran it: if your "
                      "data and machine look fine, please report it as a mirrorkit bug with "
                      "the traceback above and the output of `mirrorkit info --json`.")
        super().__init__(f"{what}. {advice}")
        self.error = error

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo("".join(traceback.format_exception(
            type(self.error), self.error, self.error.__traceback__)), file=file, err=True, nl=False)
        super().show(file)


def _raised_in(error: BaseException) -> str:
    """``"mirrorkit"``, or the installed package whose code raised ``error`` (innermost frame)."""
    import os
    import sysconfig

    tb, frame = error.__traceback__, None
    while tb is not None:
        frame, tb = tb.tb_frame, tb.tb_next
    if frame is None:
        return "mirrorkit"
    path = os.path.abspath(frame.f_code.co_filename)
    installed = {os.path.abspath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib",
                                                                            "stdlib")}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if path.startswith(here + os.sep) or not any(path.startswith(p + os.sep) for p in installed):
        return "mirrorkit"
    return str(frame.f_globals.get("__name__", "")).split(".")[0] or "a library"


@contextlib.contextmanager
def bug_reports() -> Iterator[None]:
    """Report an unexpected exception as a bug in mirrorkit: traceback, then one line.

    The commands wrap their library calls in :func:`user_errors`, so what
    reaches this is either not a user's mistake or raised by a command's
    own code: both are mirrorkit's to fix. A lost multi-worker peer is not a
    bug either: it propagates unchanged, so the one-line account of
    :mod:`mirrorkit.distribute.peer_loss` ends the process as before.

    Example:
        >>> with bug_reports():                          # doctest: +SKIP
        ...     raise RuntimeError("step counter went backwards")
        Traceback (most recent call last):
        ...
        Error: RuntimeError: step counter went backwards. This is a bug in mirrorkit ...
    """
    try:
        yield
    except _CLICK_FLOW:
        raise
    except Exception as err:
        from mirrorkit.distribute.peer_loss import explain

        if explain(err) is not None:
            raise
        raise InternalError(err) from err


def simulate_cpus_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--simulate-cpus N``: split a GPU-less CPU into N logical devices."""
    return click.option(
        "--simulate-cpus",
        type=click.IntRange(min=1),
        default=None,
        # No click envvar: the library itself falls back to the variable, so
        # a flag and the variable behave the same in scripts and the CLI.
        help="Split a GPU-less CPU into N logical devices so MirroredStrategy "
        "gets N replicas (ignored when GPUs are present). Default: "
        "$MIRRORKIT_SIMULATE_CPUS, else none.",
    )(func)


def strategy_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--strategy KIND``: auto, default, mirrored or multi_worker."""
    from mirrorkit.distribute.strategy import KINDS

    return click.option(
        "--strategy",
        type=click.Choice(KINDS),
        default=None,
        help="Which tf.distribute strategy to use. Default: $MIRRORKIT_STRATEGY, else auto.",
    )(func)


@contextlib.contextmanager
def logging_to(name: str, handler: logging.Handler) -> Iterator[None]:
    """Logger ``name``'s INFO records go to ``handler`` only, while in the block.

    A command's progress lines (the launcher's, the runner's) are part of its
    output, not debugging detail; the logger's level and propagation come back after.

    Example:
        >>> with logging_to("mirrorkit.launcher", logging.StreamHandler()):   # doctest: +SKIP
        ...     logging.getLogger("mirrorkit.launcher").info("2 workers")
    """
    log = logging.getLogger(name)
    saved = (log.level, log.propagate)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
