"""Everything mirrorkit changes in Keras, TensorFlow or Python, and the one way it does it.

* :mod:`~mirrorkit.patching.record`: what one patch is (:class:`Patch`, a fix's
  :class:`~mirrorkit.patching.record.Bug` and :class:`~mirrorkit.patching.record.Target`).
* :mod:`~mirrorkit.patching.fixes`, :mod:`~mirrorkit.patching.loss_fixes`: one record per
  upstream fix; :mod:`~mirrorkit.patching.adaptations`: the others.
* :mod:`~mirrorkit.patching.catalogue`: every patch (:data:`PATCHES`), the one table.
* :mod:`~mirrorkit.patching.targets`: each patched owner found by its role.
* :mod:`~mirrorkit.patching.versions`: installed versions, whichever distribution provides them.
* :mod:`~mirrorkit.patching.switches`: which are turned off by name.
* :mod:`~mirrorkit.patching.spots`: the functions several fixes change, and their layers' order.
* :mod:`~mirrorkit.patching.engine`: apply, undo, one marker; a spot wrapped once (``join``).
* :mod:`~mirrorkit.patching.status`: each patch's status for ``mirrorkit info``.

Example:
    >>> from mirrorkit import patching
    >>> "script-strategies" in patching.PATCHES
    True
"""

from mirrorkit.patching.catalogue import PATCHES
from mirrorkit.patching.engine import (
    applied,
    enabled,
    in_force,
    is_applied,
    on_object,
    original,
    patched_by,
    replace,
    undo,
)
from mirrorkit.patching.record import Patch
from mirrorkit.patching.switches import check_names, disabled

__all__ = [
    "PATCHES",
    "Patch",
    "applied",
    "check_names",
    "disabled",
    "enabled",
    "in_force",
    "is_applied",
    "on_object",
    "original",
    "patched_by",
    "replace",
    "undo",
]
