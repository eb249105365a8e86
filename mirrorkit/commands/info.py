"""``mirrorkit info``: what this machine has and which strategy would be used."""

from __future__ import annotations

import json

import click

from mirrorkit.commands._common import (
    simulate_cpus_option,
    strategy_option,
    user_errors,
)

# How each compat status reads in the report.
_FIX_STATES = {"not-applied": "needed; applied once a strategy with 2+ replicas exists",
               "applied": "needed; applied", "not-needed": "not needed"}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--probe", is_flag=True,
              help="Also run every fix's probe on this strategy (2+ replicas, e.g. with "
                   "--simulate-cpus 2): does the bug show with Keras alone, is it gone with "
                   "the fix? Takes a few seconds per fix.")
@simulate_cpus_option
@strategy_option
def info(as_json: bool, probe: bool, simulate_cpus: int | None, strategy: str | None) -> None:
    """Report versions, devices and the strategy mirrorkit would choose, and why.

    Under a multi-worker TF_CONFIG the cluster is described without joining it.
    Every patch mirrorkit applies to Keras, TensorFlow or Python is listed with
    its status (--json: its targets, reason, scope and tested versions too).

    \b
    Examples:
      mirrorkit info
      mirrorkit info --simulate-cpus 4 --json
      mirrorkit info --simulate-cpus 2 --probe
      TF_CONFIG='{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}' mirrorkit info
    """
    from mirrorkit import _env
    from mirrorkit.distribute.report import environment_report

    with user_errors():
        _env.quiet_tensorflow()
        data = environment_report(strategy=strategy, simulate_cpus=simulate_cpus, probe=probe)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        if key in ("warnings", "compat_fixes", "patches"):
            continue
        if isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        elif key == "distributions":
            value = ", ".join(f"{module} from {dist}" for module, dist in value.items())
        click.echo(f"{key:<{width}}  {value}")
    click.echo(f"patches (what mirrorkit changes in Keras, TensorFlow and Python; turn one off "
               f"with MIRRORKIT_COMPAT_DISABLE=NAME):")
    names = max(len(p["name"]) for p in data["patches"])
    for patch in data["patches"]:
        state = _FIX_STATES.get(patch["status"], patch["status"])
        probed = f"; {patch['probed']['says']}" if "probed" in patch else ""
        click.echo(f"  {patch['kind']:<10} {patch['name']:<{names}}  {state} "
                   f"({patch['how']}: {patch['detail']}){probed}")
    for warning in data["warnings"]:
        click.echo(f"warning: {warning}")
