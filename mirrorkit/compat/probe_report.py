"""Every fix's probe, run twice on a strategy: on Keras's own code, then with mirrorkit's fixes.

The first run answers "does this Keras/TensorFlow still have the bug?", the
second "does mirrorkit's fix make it one device's?". ``mirrorkit info
--probe --simulate-cpus 2`` prints both per fix: the version table says what
the tests showed on the versions they ran; this says what happens here, now.

Example:
    >>> import mirrorkit                                           # doctest: +SKIP
    >>> report = probe_all(mirrorkit.get_strategy(simulate_cpus=2))  # doctest: +SKIP
    >>> report["multi-step"]                                       # doctest: +SKIP
    {'keras': True, 'fixed': False, 'seconds': 0.41}
"""

from __future__ import annotations

import time
from typing import Any

from mirrorkit.compat import registry


def _run(fix: registry.Fix, strategy: Any) -> tuple[bool | None, float]:
    if fix.probe is None:
        return None, 0.0
    start = time.perf_counter()
    try:
        found = fix.probe(strategy)
    except Exception:  # noqa: BLE001 -- a probe reports, it never raises; None is "cannot tell"
        found = None
    return found, round(time.perf_counter() - start, 2)


def probe_all(strategy: Any) -> dict[str, dict[str, Any]]:
    """Run each fix's probe with every fix off, then with the fixes the environment allows on.

    Args:
        strategy: the strategy to probe on (2+ local replicas; on one replica
            every answer is None, and across workers all but the multi-worker
            bugs' (:mod:`mirrorkit.compat.probes_workers`), which need every
            worker to call this at once).

    Returns:
        Fix name -> ``{"keras": bool | None, "fixed": bool | None, "seconds": float}``:
        ``keras`` True when the bug shows with Keras's own code, ``fixed``
        True when it still shows with mirrorkit's fixes applied (a fix that
        does not work), None where the probe cannot tell here.

    Example:
        >>> probe_all(None)["symbolic-build"]["keras"] is None     # doctest: +SKIP
        True
    """
    registry.revert()  # Keras's own code, as each probe must see it
    try:
        bare = {name: _run(fix, strategy) for name, fix in registry.FIXES.items()}
    finally:
        registry.apply(strategy=strategy)
    report = {}
    for name, fix in registry.FIXES.items():
        found, seconds = bare[name]
        after = _run(fix, strategy)[0] if fix.is_applied() else found
        report[name] = {"keras": found, "fixed": after, "seconds": seconds}
    return report


def describe(result: dict[str, Any], *, check: bool = False) -> str:
    """One phrase for ``mirrorkit info``: what the probe found here.

    ``check``: the fix only names the problem (its record's ``Bug.check``),
    so the bug is expected to show with it too.

    Example:
        >>> describe({"keras": True, "fixed": False, "seconds": 0.3})
        'probe: bug shown with Keras alone, gone with the fix'
    """
    keras, fixed = result["keras"], result["fixed"]
    if keras is None:
        return ("probe: cannot tell here (needs 2+ local replicas, or the bug shows only "
                "across workers)")
    bug = "bug shown with Keras alone" if keras else "no bug with Keras alone"
    if fixed is None:
        return f"probe: {bug}"
    if check and fixed:
        return f"probe: {bug}; a check: named in one line where a script does it"
    return f"probe: {bug}, {'STILL THERE' if fixed else 'gone'} with the fix"
