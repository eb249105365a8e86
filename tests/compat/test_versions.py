"""Version comparison of the known-issues table: PEP 440, pre-releases before their release."""

from __future__ import annotations

import pytest

from mirrorkit import compat
from mirrorkit.compat.known_issues import (
    KNOWN_ISSUES,
    KnownIssue,
    affecting,
    parse_version,
)


def test_a_pre_release_sorts_before_its_release():
    assert parse_version("2.21.0rc1") < parse_version("2.21.0")
    assert parse_version("2.21.0rc1") != parse_version("2.21.0")
    assert parse_version("2.21.0.dev20250101") < parse_version("2.21.0rc1") < parse_version("2.21.0")
    assert parse_version("2.21.0") < parse_version("2.21.0.post1") < parse_version("2.21.1")
    assert parse_version("3.15") == parse_version("3.15.0")
    assert parse_version("3.9.0") < parse_version("3.10.0")  # numeric, not text


def test_a_version_that_is_not_pep_440_is_a_value_error():
    with pytest.raises(ValueError, match="Received: text='banana'"):
        parse_version("banana")


# The range (2.19.1, 2.21.0) is the pinned releases' tested range; the issue's first/fixed
# versions are made up to exercise both ends.
ISSUE = KnownIssue("tf#1", "tensorflow", "2.20.0", "2.22.0", "-", "-", ("2.19.1", "2.21.0"))


@pytest.mark.parametrize("version, tested", [
    ("2.19.1", True), ("2.20.0", True), ("2.21.0", True),
    # The matrix tests releases: a candidate is untested, even one that
    # sorts inside the range (2.21.0rc1 > 2.19.1) ...
    ("2.21.0rc1", False), ("2.20.0rc0", False), ("2.19.1rc2", False),
    ("2.22.0.dev20250101", False),
    # ... while a local build of a tested release is that release.
    ("2.21.0+cu121", True),
    ("2.19.0", False), ("2.21.1", False), ("2.21.0.post1", False), ("banana", False),
])
def test_only_tested_releases_are_tested(version, tested):
    assert ISSUE.tested_on(version) is tested


def test_a_pre_release_that_is_itself_an_end_of_the_range_is_tested():
    issue = KnownIssue("x#1", "keras", "3.0", None, "-", "-", ("3.16.0rc1", "3.16.0rc1"))
    assert issue.tested_on("3.16.0rc1") and not issue.tested_on("3.16.0")


@pytest.mark.parametrize("version, affected", [
    ("2.19.1", False),
    # A candidate of the first affected release already has the bug ...
    ("2.20.0rc1", True), ("2.20.0", True), ("2.21.0rc1", True),
    # ... and one of the fixed release may not have the fix yet.
    ("2.22.0rc0", True), ("2.22.0", False), ("2.22.1", False),
    # Unknown: assume affected, so the (harmless) fix is applied.
    ("banana", True), (None, False),
])
def test_affects_treats_pre_releases_as_affected_when_in_doubt(version, affected):
    assert ISSUE.affects(version) is affected


def test_an_rc_of_the_tested_keras_is_decided_by_probe_or_assumption_not_the_table():
    decision = compat.FIXES["multi-step"].decide(None, keras_version="3.15.1rc1")
    assert (decision.needed, decision.how) == (True, "assumed"), decision
    assert compat.FIXES["multi-step"].decide(None, keras_version="3.15.1").how == "version table"


def _release(text):
    return tuple(int(part) for part in text.split("."))


@pytest.mark.parametrize("versions", [{"keras": "3.15.1", "tensorflow": "2.21.0"},
                                      {"keras": "3.15.1", "tensorflow": "2.19.1"},
                                      {"keras": "3.0.0", "tensorflow": "2.16.1"}])
def test_for_releases_the_table_answers_as_plain_number_tuples_do(versions):
    # Releases (no rc) compare as tuples of numbers: the table's answers for them
    # did not change with PEP 440 parsing.
    expected = {i.ref for i in KNOWN_ISSUES
                if _release(i.first) <= _release(versions[i.package])
                and (i.fixed is None or _release(versions[i.package]) < _release(i.fixed))}
    assert {i.ref for i in affecting(versions)} == expected
    assert affecting({"keras": "2.15.0", "tensorflow": "1.15.0"}) == []
