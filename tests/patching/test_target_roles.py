"""Every patched target is found by its role, and its record knows how this release spells it.

Run on the pinned releases and on the nightlies (``.ci/run``): the day a
release renames a class or moves a module, the role still finds it and
:func:`targets.check` fails here, naming the spelling to add to the record,
before any user meets a fix gone quiet.
"""

from __future__ import annotations

import dataclasses

import pytest

from mirrorkit.compat import FIXES
from mirrorkit.patching import targets


@pytest.mark.fast
@pytest.mark.parametrize("role", sorted(targets.ROLES))
def test_each_role_is_found_and_spelled_in_its_record_for_the_installed_versions(role):
    assert targets.check(role) is None, targets.check(role)


@pytest.mark.fast
def test_a_spelling_missing_from_the_record_fails_the_check():
    # The record as it would read before Keras 3.16: the installed release's
    # spelling absent. The check must name what it found and where to add it.
    role = targets.ROLES["backend-trainer"]
    found = targets.dotted_name(role.find())
    stripped = dataclasses.replace(role, spellings=tuple(
        (dotted, versions) for dotted, versions in role.spellings if dotted != found))
    problem = targets.check("backend-trainer", roles={"backend-trainer": stripped})
    assert problem is not None and found in problem and "targets.py" in problem


@pytest.mark.fast
def test_a_spelling_recorded_for_other_versions_does_not_count():
    role = targets.ROLES["backend-trainer"]
    found = targets.dotted_name(role.find())
    elsewhere = dataclasses.replace(role, spellings=((found, "keras<1.0"),))
    assert targets.check("backend-trainer", roles={"backend-trainer": elsewhere}) is not None


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(FIXES))
def test_every_fix_names_roles_that_exist_and_finds_every_spot_here(name):
    fix = FIXES[name]
    for role, _attr in [fix.target] + [(role, attr) for role, attr, _ in fix.also]:
        assert role in targets.ROLES, f"{name}: target role {role!r} has no record"
    fix.find_targets()  # raises FixUnavailable naming the spot that is gone


@pytest.mark.fast
def test_roles_find_by_what_the_owner_does_not_by_its_name():
    import keras

    trainer = targets.owner("backend-trainer")
    assert trainer in keras.Model.__mro__ and "make_train_function" in vars(trainer)
    assert "compile" in vars(targets.owner("base-trainer"))
    assert hasattr(targets.owner("backend-nn"), "conv")
    with pytest.raises(LookupError, match="unknown target role"):
        targets.owner("no-such-role")


@pytest.mark.fast
@pytest.mark.parametrize("versions, installed, expected", [
    ("keras>=3.16.0.dev0", {"keras": "3.16.0.dev2026102704"}, True),
    ("keras>=3.0,<3.16.0.dev0", {"keras": "3.16.0.dev2026102704"}, False),
    ("keras>=3.0,<3.16.0.dev0", {"keras": "3.15.1"}, True),
    ("tensorflow>=2.16", {"tensorflow": "2.23.0.dev20261026"}, True),
    ("keras>=3.0", {"keras": None}, False),
])
def test_version_ranges_include_pre_releases(versions, installed, expected):
    assert targets.applies(versions, installed) is expected
