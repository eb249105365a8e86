"""Helpers shared by the commands: user errors to one line, common options."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import click

# Library errors a user can cause with bad input or environment. Anything else
# is a bug in mirrorkit and keeps its traceback.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               PermissionError, RuntimeError, ImportError)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's user-facing exceptions into one-line click errors.

    Example:
        >>> with user_errors():                          # doctest: +SKIP
        ...     raise ValueError("bad value")
        Error: bad value
    """
    try:
        yield
    except click.ClickException:
        raise
    except USER_ERRORS as err:
        text = " ".join(str(err).split()) or type(err).__name__
        raise click.ClickException(text) from err


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
