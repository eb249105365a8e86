"""glibc's allocator thresholds, put back after TensorFlow freezes them (CPU steps ran 2x slower).

TensorFlow 2.21's ``GeneratorDataset`` kernel calls
``mallopt(M_TRIM_THRESHOLD, 128 KiB)`` once per process (its log line:
"Memory patch applied: M_TRIM_THRESHOLD=128 kb was set"). Every distributed
iterator uses that kernel (``MultiDeviceIterator``, ``copy_to_device``), so
every ``fit`` under a ``tf.distribute`` strategy sets it. Setting any
threshold switches off glibc's *dynamic* mmap threshold, which then stays at
its 128 KiB start: each tensor larger than that is a fresh ``mmap``, faulted
in page by page and unmapped when freed, on every step. Measured on 2 CPU
cores (``benchmarks/floor.py``, cnn on digits, one replica): a bare
``tf.function`` train step takes 3.6 ms before the first distributed
iterator and 7.1 ms after it; with the thresholds put back, 3.6 ms again.

The fix makes TensorFlow apply its setting now (one trivial
``GeneratorDataset``) and then, when a probe shows the churn (re-allocating a 1 MiB
buffer 50 times faults its pages in again), sets ``M_MMAP_THRESHOLD`` to
32 MiB and ``M_TRIM_THRESHOLD`` to 64 MiB: the ceiling glibc's own dynamic
threshold would rise to and the trim threshold glibc pairs with it. The cost
is memory glibc keeps for reuse instead of returning it at once, bounded by
those thresholds. A probe decides, not a version number, so a TensorFlow
that drops its setting needs nothing (``not-needed``). Off with
``MIRRORKIT_COMPAT_DISABLE=malloc-thresholds`` (or ``MIRRORKIT_COMPAT=off``).

It acts only once TensorFlow's runtime has started (a strategy exists):
starting it earlier would freeze the device list before mirrorkit splits the
CPU. :func:`mirrorkit.compat.apply` calls it, so every strategy mirrorkit
creates and every ``mirrorkit run`` script gets it. Called earlier (a
program under ``mirrorkit launch`` gets the fixes when it imports Keras,
before it creates its strategy), it waits: the program's first
``experimental_distribute_dataset`` / ``distribute_datasets_from_function``
(``fit`` calls one, custom loops call one) decides, just before the first
distributed iterator exists.

Example:
    >>> from mirrorkit.compat import allocator
    >>> allocator.restore()                # doctest: +SKIP
    'applied'
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import resource
import threading
from typing import Any

from mirrorkit.patching import engine

logger = logging.getLogger(__name__)

NAME = "malloc-thresholds"
# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where its dynamic threshold
# stops rising; it pairs the trim threshold at twice the mmap threshold.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
_PROBE_BYTES = 1 << 20
_PROBE_ROUNDS = 50

_state: dict[str, str] = {}
# The StrategyBase methods wrapped while a decision waits: name -> original.
_DISTRIBUTE_METHODS = ("experimental_distribute_dataset", "distribute_datasets_from_function")


def _libc() -> Any | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def churn_faults(libc: Any) -> int:
    """Page faults of allocating, touching and freeing a 1 MiB buffer 50 times.

    With glibc's dynamic threshold the buffer is reused (a few hundred
    faults, the first round); frozen at 128 KiB each round faults every page
    in again (~12,800 with 4 KiB pages).

    Example:
        >>> churn_faults(_libc()) >= 0               # doctest: +SKIP
        True
    """
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []

    def rounds() -> None:
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(_PROBE_ROUNDS):
            block = libc.malloc(_PROBE_BYTES)
            if not block:
                break
            ctypes.memset(block, 1, _PROBE_BYTES)
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

    # A new thread, like TensorFlow's: its own arena, trimmed by the same
    # threshold, away from the main arena's fragmentation.
    thread = threading.Thread(target=rounds, name="mirrorkit-malloc-probe")
    thread.start()
    thread.join()
    return faults[0] if faults else 0


def _churning(libc: Any) -> bool:
    # Churn: at least 10 rounds' worth of pages faulted again (a reused
    # buffer faults once, in the first round).
    pages = _PROBE_BYTES // resource.getpagesize()
    return churn_faults(libc) >= 10 * pages


def _runtime_started() -> bool:
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None
    except Exception:  # noqa: BLE001 -- a TensorFlow without this internal: assume not
        return False


def _trigger_tensorflow() -> None:
    # TensorFlow applies its mallopt once, when a GeneratorDataset kernel is
    # first made. The raw op with three trivial functions makes one for 0.15
    # CPU-s less than the smallest public dataset that uses it (copy_to_device),
    # in every process.
    import tensorflow as tf

    def start() -> Any:
        return tf.constant(0, tf.int64)

    def step(state: Any) -> Any:   # a named argument: `*args` makes invalid node names
        return tf.constant(0, tf.int64)

    init = tf.function(start, input_signature=[]).get_concrete_function()
    # The same function serves as next and finalize: both take the state.
    step_fn = tf.function(step, input_signature=[tf.TensorSpec([], tf.int64)]
                          ).get_concrete_function()
    tf.raw_ops.GeneratorDataset(
        init_func_other_args=[], next_func_other_args=[], finalize_func_other_args=[],
        init_func=init, next_func=step_fn, finalize_func=step_fn, output_types=[tf.int64],
        output_shapes=[[]])


def restore(disabled: bool = False) -> str:
    """Put glibc's allocation thresholds back if TensorFlow froze them (see the module docstring).

    Args:
        disabled: leave the allocator as TensorFlow set it.

    Returns:
        ``"applied"``, ``"not-needed"`` (no churn: another TensorFlow, or not
        glibc), ``"disabled"``, ``"waiting"`` (TensorFlow's runtime has not
        started yet; a later call decides) or ``"unavailable"`` (the probe
        or ``mallopt`` failed). Decided once per process.

    Example:
        >>> restore()                              # doctest: +SKIP
        'applied'
    """
    if disabled:
        _stop_waiting()
        # mallopt cannot be undone: a process that already applied it stays so.
        return "applied" if _state.get(NAME) == "applied" else "disabled"
    if NAME in _state:
        return _state[NAME]
    libc = _libc()
    if libc is None:
        _state[NAME] = "not-needed"
        return _state[NAME]
    if not _runtime_started():
        _decide_at_first_distributed_dataset()
        return "waiting"
    _stop_waiting()
    try:
        _trigger_tensorflow()
        if not _churning(libc):
            _state[NAME] = "not-needed"
        elif libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and \
                libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1:
            _state[NAME] = "applied"
        else:
            _state[NAME] = "unavailable"
    except Exception as err:  # noqa: BLE001 -- never break the caller over a speed fix
        logger.warning("mirrorkit: compat fix %r cannot apply: %s: %s", NAME,
                       type(err).__name__, err)
        _state[NAME] = "unavailable"
    logger.info("mirrorkit.compat: %s=%s", NAME, _state[NAME])
    return _state[NAME]


def _decide_at_first_distributed_dataset() -> None:
    # A strategy exists once it distributes a dataset, and no distributed
    # iterator does yet: the moment to decide. Wrapped on the base class, so
    # every strategy's (and Keras fit's) call goes through it once.
    if engine.is_applied(NAME):
        return
    try:
        from tensorflow.python.distribute import distribute_lib
    except ImportError:  # a TensorFlow without this module: stay "waiting"
        return
    base = distribute_lib.StrategyBase
    for name in _DISTRIBUTE_METHODS:
        if name in vars(base):
            # restore() decided whether this patch is wanted: force.
            engine.replace(NAME, base, name, _deciding_first, force=True)


def _deciding_first(original: Any) -> Any:
    def first_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        from tensorflow.python.eager import context

        # Inside a tf.function the probe's iterator cannot run: decide later.
        if context.executing_eagerly():
            restore()
        return original(self, *args, **kwargs)

    return first_call


def _stop_waiting() -> None:
    engine.undo(NAME)


def state() -> str:
    """This process's decision so far: ``restore``'s answer, or ``"not-applied"``.

    Example:
        >>> state()                                # doctest: +SKIP
        'applied'
    """
    return _state.get(NAME, "not-applied")
