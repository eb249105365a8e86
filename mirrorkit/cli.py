"""The ``mirrorkit`` command line: a click group that loads each command lazily.

Each command lives in ``mirrorkit/commands/<name>.py`` and is imported only
when it runs or when its help is shown, so ``mirrorkit --help`` never imports
TensorFlow. Every option has an environment twin (``MIRRORKIT_<COMMAND>_<OPTION>``)
through click's ``auto_envvar_prefix``.

Example:
    $ mirrorkit info --simulate-cpus 2
    $ mirrorkit train --epochs 3
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

import click

from mirrorkit._version import __version__

# name -> "module:attribute"; order is the order shown in --help.
_COMMANDS = {
    "info": "mirrorkit.commands.info:info",
    "train": "mirrorkit.commands.train:train",
    "run": "mirrorkit.commands.run:run",
    "launch": "mirrorkit.commands.launch:launch",
    "tf-config": "mirrorkit.commands.tf_config:tf_config",
    "export": "mirrorkit.commands.export:export",
    "export-model": "mirrorkit.commands.export_model:export_model",
    "bench": "mirrorkit.commands.bench:bench",
    "report": "mirrorkit.commands.report:report",
}


def _available(target: str) -> bool:
    # A command module may be absent in a partial install; list only real ones.
    return importlib.util.find_spec(target.partition(":")[0]) is not None


class _LazyGroup(click.Group):
    """A group whose commands are imported on first use (keeps start-up fast)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, target in _COMMANDS.items() if _available(target)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = _COMMANDS.get(name)
        if target is None or not _available(target):
            return None
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context) -> Any:
        # Here rather than in main() so CliRunner sees what a user sees: a
        # mistake of theirs is one line (user_errors, in each command), an
        # unexpected exception is a bug in mirrorkit, shown with its traceback.
        from mirrorkit.commands._common import bug_reports

        with bug_reports():
            return super().invoke(ctx)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mirrorkit")
def cli() -> None:
    """Train Keras vision models on every local device or several machines.

    \b
    Examples:
      mirrorkit info --simulate-cpus 2
      mirrorkit train --epochs 3
      mirrorkit run --simulate-cpus 2 my_keras_script.py --epochs 1
    """


def main(argv: list[str] | None = None) -> Any:
    """Entry point of the ``mirrorkit`` console script.

    A usage mistake (an unknown option, ``--epochs abc``) is one line naming
    the help to read, exit status 2, instead of click's usage block. Another
    mistake of the user's is one line and status 1; an exception mirrorkit
    did not expect keeps its traceback, followed by one line saying it is a
    bug to report (status 1, see ``commands._common.bug_reports``). Ctrl-C
    is one line and status 130, as a shell reports a program SIGINT
    stopped. The umask gains ``o-w``: run folders, models and logs (also the launched
    workers') are never world-writable, otherwise as the user's umask says.
    TensorFlow starts as in a launched worker (:mod:`mirrorkit.launcher.startup`).

    Example:
        >>> main(["--help"])                             # doctest: +SKIP
    """
    # Whatever the umask, nothing mirrorkit or its workers write is world-writable.
    os.umask(os.umask(0) | 0o002)
    # Before anything imports TensorFlow: what makes its start cheaper
    # (paid by every command that trains, every worker, every restart).
    from mirrorkit.launcher import startup

    startup.install()
    try:
        code = cli.main(args=argv, prog_name="mirrorkit", auto_envvar_prefix="MIRRORKIT",
                        standalone_mode=False)
    except click.UsageError as err:
        where = err.ctx.command_path if err.ctx is not None else "mirrorkit"
        click.echo(f"Error: {err.format_message()} (see '{where} --help')", err=True)
        sys.exit(err.exit_code)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except (click.Abort, KeyboardInterrupt, EOFError) as err:
        # click turns Ctrl-C into Abort: the status a shell gives a program SIGINT
        # stopped (128 + 2), as plain Python's; what was written before it stays.
        if isinstance(err, KeyboardInterrupt) or isinstance(err.__context__, KeyboardInterrupt):
            click.echo(f"mirrorkit {_command(argv)}: interrupted (Ctrl-C)", err=True)
            sys.exit(130)
        click.echo("Aborted!", err=True)
        sys.exit(1)
    # Without standalone mode click returns ctx.exit()'s status instead of exiting.
    sys.exit(code if isinstance(code, int) else 0)


def _command(argv: list[str] | None) -> str:
    """The subcommand the user ran (``run``, ``train`` ...), for a one-line message."""
    args = sys.argv[1:] if argv is None else argv
    return next((a for a in args if not a.startswith("-")), "").strip() or "(no command)"


if __name__ == "__main__":  # `python -m mirrorkit.cli`, used by tests and `mirrorkit run`
    main()
