"""Every change mirrorkit makes to Keras, TensorFlow or Python, one :class:`Patch` each.

This table is the answer to "what did mirrorkit change in my Keras, and how do
I turn one thing off?": one record per patch, the only place a patch is
described (the fixes in :mod:`~mirrorkit.patching.fixes` and
:mod:`~mirrorkit.patching.loss_fixes`, the adaptations in
:mod:`~mirrorkit.patching.adaptations`). ``mirrorkit info`` lists it with each patch's status,
and ``MIRRORKIT_COMPAT_DISABLE=NAME[,NAME]`` turns any of them off by name
(``MIRRORKIT_COMPAT=off``: every ``fix``). The code of a patch lives where its
concept does (:mod:`mirrorkit.compat` for upstream bugs, :mod:`mirrorkit.runner`
for ``mirrorkit run``'s adaptations ...) and installs it only through
:mod:`mirrorkit.patching.engine`, which refuses a name that is not here.

Example:
    >>> from mirrorkit.patching.catalogue import PATCHES
    >>> PATCHES["chief-only-model-save"].targets
    ('keras.Model.save', 'keras.Model.save_weights')
    >>> PATCHES["symbolic-build"].bug.ref
    'keras-team/keras#20585'
"""

from __future__ import annotations

from mirrorkit.patching.adaptations import ADAPTATIONS
from mirrorkit.patching.fixes import FIX_RECORDS
from mirrorkit.patching.loss_fixes import LOSS_FIX_RECORDS
from mirrorkit.patching.record import Patch

PATCHES: dict[str, Patch] = {p.name: p for p in (*FIX_RECORDS, *LOSS_FIX_RECORDS, *ADAPTATIONS)}
