"""One record per fix, in one table: everything else about a fix is built from it.

The registry's mechanics, the known-issues list and ``mirrorkit info``'s lines
come from :data:`mirrorkit.patching.PATCHES`; a second description of a fix
anywhere would have to agree with it, so there must be none. Fixes that wrap
the same function say in which order (``after``), so no dict's order decides
what a replica's gradient is.
"""

from __future__ import annotations

import ast
import re

import pytest
from conftest import REPO

from mirrorkit.compat import FIXES, registry
from mirrorkit.compat.known_issues import KNOWN_ISSUES
from mirrorkit.patching import PATCHES
from mirrorkit.patching.record import Bug, Target, fix_record

FIX_NAMES = [name for name, p in PATCHES.items() if p.kind == "fix" and p.mechanics()]
_REF = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


def _below(name: str) -> set[str]:
    """Every fix ``name`` goes on top of, directly or through another."""
    seen: set[str] = set()
    todo = list(PATCHES[name].after)
    while todo:
        below = todo.pop()
        if below not in seen:
            seen.add(below)
            todo.extend(PATCHES[below].after)
    return seen


@pytest.mark.fast
def test_fixes_that_wrap_the_same_function_say_which_goes_on_top():
    spots: dict[tuple[str, str], list[str]] = {}
    for name in FIX_NAMES:
        for target in PATCHES[name].mechanics():
            spots.setdefault((target.role, target.attr), []).append(name)
    order = list(FIXES)
    for spot, names in spots.items():
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                assert first in _below(second) or second in _below(first), (
                    f"{first} and {second} both wrap {spot}: one must name the other in "
                    "`after`, or which wrapper is outermost depends on where a record sits")
                lower, upper = (first, second) if first in _below(second) else (second, first)
                assert order.index(lower) < order.index(upper)


@pytest.mark.fast
def test_the_registry_orders_by_after_and_refuses_unknown_names_and_cycles():
    def record(name, after=()):
        return fix_record(name, targets=(Target("loss", "__call__", "x:y"),), changes="c",
                          reason="r", control="c", after=after)

    ordered = registry._in_order([record("top", ("middle",)), record("middle", ("base",)),
                                  record("base"), record("alone")])
    assert [r.name for r in ordered] == ["base", "middle", "top", "alone"]
    with pytest.raises(ValueError, match="after names no fix"):
        registry._in_order([record("a", ("nope",))])
    with pytest.raises(ValueError, match="cycle"):
        registry._in_order([record("a", ("b",)), record("b", ("a",))])


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
