"""The patch engine: apply, undo, one marker, turned off by name, unknown names refused."""

from __future__ import annotations

import types

import pytest

from mirrorkit import _env
from mirrorkit.patching import PATCHES, engine, switches


def _target():
    class Owner:
        def method(self):
            return "theirs"

    class Child(Owner):
        pass

    return Owner, Child


def test_replace_marks_and_undo_restores_an_inherited_attribute():
    Owner, Child = _target()
    engine.replace("speed-up-fit", Child, "method", lambda m: lambda self: "ours " + m(self))
    try:
        assert Child().method() == "ours theirs"
        assert engine.patched_by(Child.method) == "speed-up-fit"
        assert engine.original(Child.method) is Owner.method
        assert engine.is_applied("speed-up-fit")
        assert any(n.endswith("Child.method") for n in engine.in_force()["speed-up-fit"])
    finally:
        assert engine.undo("speed-up-fit") == 1
    # Inherited again, not a copy of the parent's function on the child.
    assert "method" not in vars(Child) and Child().method() == "theirs"
    assert not engine.is_applied("speed-up-fit")


def test_a_property_stays_a_property():
    class Owner:
        @property
        def handle(self):
            return 1

    engine.replace("speed-up-fit", Owner, "handle",
                   lambda prop: property(lambda self: prop.fget(self) + 1))
    try:
        assert Owner().handle == 2
    finally:
        engine.undo("speed-up-fit")
    assert Owner().handle == 1


def test_applied_undoes_only_its_own_block_even_on_error():
    ns = types.SimpleNamespace(f=abs)
    with pytest.raises(RuntimeError):
        with engine.applied("get-file-lock", [(ns, "f", lambda f: round)]) as on:
            assert on and ns.f is round
            raise RuntimeError("the script failed")
    assert ns.f is abs and not engine.is_applied("get-file-lock")


def test_a_newer_replacement_on_top_is_left_alone():
    ns = types.SimpleNamespace(f=abs)
    engine.replace("speed-up-fit", ns, "f", lambda f: round)
    ns.f = min  # somebody else's, after ours
    engine.undo("speed-up-fit")
    assert ns.f is min


def test_a_name_outside_the_catalogue_is_refused():
    ns = types.SimpleNamespace(f=abs)
    with pytest.raises(ValueError, match="Unknown patch 'my-wrap'.*catalogue.py"):
        engine.replace("my-wrap", ns, "f", lambda f: round)
    assert ns.f is abs


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_every_patch_can_be_turned_off_by_name(name):
    ns = types.SimpleNamespace(f=abs)
    with _env.patch({_env.COMPAT_DISABLE: name}):
        assert engine.replace(name, ns, "f", lambda f: round) is None
        with engine.applied(name, [(ns, "f", lambda f: round)]) as on:
            assert not on and ns.f is abs
        assert engine.on_object(name, ns, "f", round) is False
    assert ns.f is abs
    # And on again without the variable.
    with engine.applied(name, [(ns, "f", lambda f: round)]) as on:
        assert on and ns.f is round


def test_compat_off_turns_off_fixes_not_adaptations():
    with _env.patch({_env.COMPAT: "off"}):
        off = switches.disabled()
    assert {"scalar-logs", "malloc-thresholds", "saving-skipset-cache"} <= off
    assert "script-strategies" not in off and "chief-only-model-save" not in off


def test_a_misspelt_name_is_one_clear_error():
    with _env.patch({_env.COMPAT_DISABLE: "scalar-log"}):
        with pytest.raises(ValueError) as err:
            engine.enabled("scalar-logs")
    message = str(err.value)
    assert "\n" not in message
    assert "Received: scalar-log;" in message and "chief-only-model-save" in message
