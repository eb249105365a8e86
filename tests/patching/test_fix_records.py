"""One record per fix, in one table: everything else about a fix is built from it.

The registry's mechanics, the known-issues list and ``mirrorkit info``'s lines
come from :data:`mirrorkit.patching.PATCHES`; a second description of a fix
anywhere would have to agree with it, so there must be none. A function several
fixes change is one spot with its layers' order written
(:mod:`mirrorkit.patching.spots`), so no dict's order decides what a replica's
gradient is.
"""

from __future__ import annotations

import ast
import re

import pytest
from conftest import REPO

from mirrorkit.compat import FIXES
from mirrorkit.compat.known_issues import KNOWN_ISSUES
from mirrorkit.patching import PATCHES, engine, spots
from mirrorkit.patching.record import Bug
from mirrorkit.patching.spots import SPOTS

FIX_NAMES = [name for name, p in PATCHES.items() if p.kind == "fix" and p.mechanics()]
_REF = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


@pytest.mark.fast
def test_a_function_several_fixes_change_is_one_spot_with_its_order_written():
    changed_by: dict[tuple[str, str], set[str]] = {}
    for name in FIX_NAMES:
        for target in PATCHES[name].mechanics():
            changed_by.setdefault((target.role, target.attr), set()).add(name)
    shared = {spot: names for spot, names in changed_by.items() if len(names) > 1}
    # Every shared function is in the table with exactly the fixes that change it:
    # else which wrapper is outermost would depend on which fix came first.
    assert {spot: set(order) for spot, order in SPOTS.items()} == shared


@pytest.mark.fast
def test_a_spots_layers_run_in_its_order_whatever_order_the_fixes_come_in():
    import types

    order = ("uneven-batch-losses", "cross-replica-step", "no-gradient-losses")

    def layer(tag):
        return lambda below: lambda: below() + [tag]

    for arrival in (order, tuple(reversed(order)), (order[1], order[0], order[2])):
        ns = types.SimpleNamespace(f=lambda: ["keras"])
        try:
            for name in arrival:
                engine.join(name, ns, "f", layer(name), order, force=True)
            assert ns.f() == ["keras", *order]
            assert spots.layers(ns.f) == order
            # One fix turned off: its layer out, the others' order kept.
            engine.undo("cross-replica-step")
            assert ns.f() == ["keras", "uneven-batch-losses", "no-gradient-losses"]
        finally:
            for name in order:
                engine.undo(name)
        assert ns.f() == ["keras"] and not spots.layers(ns.f)
    with pytest.raises(ValueError, match="does not name it"):
        engine.join("multi-step", types.SimpleNamespace(f=abs), "f", layer("x"), order)


@pytest.mark.fast
def test_two_fixes_needing_the_same_layer_run_it_once():
    import types

    calls = []
    ns = types.SimpleNamespace(f=lambda: "keras")

    def counting(below):
        def f():
            calls.append(1)
            return below()
        return f

    order = ("uneven-batch-losses", "replica-random")
    try:
        for name in order:
            engine.join(name, ns, "f", counting, order, force=True)
        assert ns.f() == "keras" and len(calls) == 1
    finally:
        for name in order:
            engine.undo(name)


@pytest.mark.fast
@pytest.mark.parametrize("name", FIX_NAMES)
def test_every_fix_record_holds_its_bug_its_report_or_reproduction_and_its_mechanics(name):
    record = PATCHES[name]
    assert isinstance(record.bug, Bug) and record.bug.error, name
    for ref in record.bug.upstream:
        assert _REF.match(ref), f"{name}: upstream {ref!r} is not owner/repo#N"
    if record.bug.repro is not None:
        assert (REPO / record.bug.repro).is_file(), f"{name}: {record.bug.repro} is missing"
    assert record.bug.upstream or record.bug.repro, (
        f"{name}: cite the upstream report, or keep a reproduction that could be filed")
    fix = FIXES[name]
    assert (fix.target, fix.make.__name__) == (
        (record.mechanics()[0].role, record.mechanics()[0].attr),
        record.mechanics()[0].make.partition(":")[2])
    assert fix.ref == record.bug.ref and fix.error == record.bug.error
    assert fix.issue().summary == record.reason


@pytest.mark.fast
def test_known_issues_are_the_records_bugs_plus_what_no_patch_handles():
    from_records = [i for i in KNOWN_ISSUES if i.ref in {PATCHES[n].bug.ref for n in FIX_NAMES}]
    assert {i.summary for i in from_records} == {PATCHES[n].reason for n in FIX_NAMES}


@pytest.mark.fast
def test_no_module_of_compat_lists_fixes_by_name_again():
    # A table of fixes outside the records is what made three tables that had to agree.
    # The fix modules may name their own fix (for the engine); none may list others. The
    # probes name the fix they probe in their log lines; which probe is a fix's, only its
    # record says.
    names = set(PATCHES)
    for path in sorted((REPO / "mirrorkit" / "compat").glob("*.py")):
        if path.name.startswith("probes_"):
            continue
        literals = {node.value for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Constant) and node.value in names}
        assert len(literals) <= 2, f"{path.name} names fixes {sorted(literals)}"
