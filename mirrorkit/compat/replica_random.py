"""The ``replica-random`` fix: each replica draws its own rows of one device's random numbers.

Keras 3 draws ``Dropout`` masks, noise (``GaussianNoise``,
``GaussianDropout``), random augmentation (``RandomFlip``, ``RandomZoom``
...) and ``keras.random.*`` from stateless ops seeded by a ``SeedGenerator``
whose state every replica shares. Under N replicas each replica draws for its
own slice of ``b`` rows with the same seed, so every replica gets the same
numbers: replica 0's are the first ``b`` rows of what one device draws for
the global batch, and the others repeat them instead of drawing theirs. The
training is another, less random one than plain Python's, silently (keras.io's
Antirectifier with ``Dropout(0.5)``: test accuracy 0.806 under 2 replicas vs
0.899 on one device; without Dropout they agree to 1e-4).

The fix makes a replica's draw exactly its rows of the one-device draw. While
``strategy.run`` calls a step (``fit``, ``evaluate``, ``predict`` and custom
loops alike), each replica knows how many rows its batch has (the first
tensor of the step's arguments). A draw whose first dimension is that row
count is batch-shaped: the replica draws the global batch's shape with the
same seed and keeps rows ``offset .. offset + b``, where ``offset`` and the
global row count come from the replicas' row counts
(:mod:`~mirrorkit.compat.step_rows`: counted before the step on one worker,
one ``all_gather`` per traced step across workers), so a last batch split
3/2 is exact too. Other draws (a ``(latent,)`` vector, a per-step scalar)
are one draw on one device, so the replicas keep sharing them. ``dropout``
draws its mask this way and applies it with TensorFlow's own dropout
arithmetic; ``categorical`` pads its logits to the global rows so every row's
sample comes from its own place in the stream.

Costs: a batch-shaped draw is made at the global batch's size on every
replica (N times the random numbers, each replica keeping 1/N): 2% slower
steps of a small Dense model on 2 simulated replicas, the same CPU time.
Across workers a step that draws also pays one small all-gather, which inside
a ``tf.cond`` branch is not emitted (a collective replicas might not all
reach): there the rows are assumed evenly split, exact for every batch but
an uneven last one.

Not covered (they keep upstream's per-replica draws): steps compiled by XLA
(``jit_compile=True``: no collective is added to them), ``gamma``,
``binomial``, ``beta`` and ``shuffle``; a ``tf.function`` handed to
``strategy.run`` itself (wrap the loop in the ``tf.function`` instead, as
TensorFlow's guides do); draws whose first dimension is not the batch's
(keras.io's GAN draws its label noise for twice the batch); TensorFlow's own
``tf.random.*`` ops; random augmentation inside a ``tf.data`` pipeline needs
nothing (the pipeline draws for the global batch before it is split).

Example:
    >>> from mirrorkit import compat
    >>> compat.apply()["replica-random"]                      # doctest: +SKIP
    'applied'
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from mirrorkit.compat import step_rows
from mirrorkit.compat.step_rows import make_run

__all__ = ["make_categorical", "make_draw", "make_dropout", "make_run"]

def shape_list(shape: Any) -> list[Any] | None:
    """``shape`` as a list of ints and int32 scalars, or None when it has no first dimension.

    Example:
        >>> shape_list((4, 3))
        [4, 3]
    """
    import tensorflow as tf

    if isinstance(shape, tf.TensorShape):
        shape = shape.as_list()
    if tf.is_tensor(shape):
        if shape.shape.rank != 1 or not shape.shape[0]:
            return None
        return [tf.cast(shape[i], tf.int32) for i in range(shape.shape[0])]
    if not isinstance(shape, (list, tuple)) or not shape:
        return None
    return [tf.cast(d, tf.int32) if tf.is_tensor(d) else d for d in shape]


def rows_of_global(dims: list[Any], draw: Callable[[list[Any]], Any],
                    full: Callable[[list[Any], Any, Any], Any] | None = None) -> Any | None:
    """Draw ``dims`` as this replica's rows of the global batch's draw, or None if not batch-shaped.

    ``draw(dims)`` is the upstream draw. ``full(dims, offset, total)`` draws the
    global shape (default: ``draw`` with the first dimension ``total``) and
    returns the rows ``offset .. offset + dims[0]``.

    Example:
        >>> rows_of_global([rows, 8], lambda d: tf.random.uniform(d))   # doctest: +SKIP
    """
    import tensorflow as tf

    rows = step_rows.current()
    context = tf.distribute.get_replica_context()
    if rows is None or context is None or context.num_replicas_in_sync <= 1:
        return None
    first = dims[0]
    if not step_rows.inside(rows.graph):
        # Outside the step's graph: a variable's initializer lifted out of
        # the step (tf.init_scope) draws what one device draws.
        return None
    static = first if isinstance(first, int) else tf.get_static_value(first)
    if static is not None and rows.static is not None and int(static) != rows.static:
        return None

    # Before the cond below: its branches are no place for a collective.
    offset, total = step_rows.share(rows, context)

    def sliced() -> Any:
        if full is not None:
            return full(dims, offset, total)
        return draw([total, *dims[1:]])[offset:offset + first]

    if static is not None and rows.static is not None:
        return sliced()
    # The first dimension or the rows are only known when the step runs.
    return tf.cond(tf.equal(tf.cast(first, tf.int32), rows.count), sliced, lambda: draw(dims))


_Drawn: Any = None   # the SeedGenerator subclass below, made on first use


def _drawn_seed(seed: Any) -> Any:
    """A ``SeedGenerator`` whose ``next()`` is the one seed tensor drawn for this call."""
    global _Drawn
    from keras.src.random.seed_generator import SeedGenerator, draw_seed

    if _Drawn is None:
        class Drawn(SeedGenerator):
            def __init__(self, value: Any) -> None:  # no state variable: already drawn
                self._value = value

            def next(self, ordered: bool = True) -> Any:
                return self._value

        _Drawn = Drawn
    return _Drawn(draw_seed(seed))


def make_draw(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a shape-first Keras TF-backend draw (``uniform``, ``normal`` ...) with the fix.

    Example:
        >>> from keras.src.backend.tensorflow import random   # doctest: +SKIP
        >>> patched = make_draw(random.uniform)                 # doctest: +SKIP
    """
    signature = inspect.signature(original)

    def draw(*args: Any, **kwargs: Any) -> Any:
        if step_rows.current() is None:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        dims = shape_list(bound.arguments["shape"])
        if dims is None:
            return original(*args, **kwargs)
        # One seed for every branch below: the generator advances once, as upstream.
        bound.arguments["seed"] = _drawn_seed(bound.arguments.get("seed"))

        def upstream(shape: list[Any]) -> Any:
            call = dict(bound.arguments, shape=shape)
            return original(**call)

        out = rows_of_global(dims, upstream)
        return upstream(dims) if out is None else with_static_shape(out, dims)

    return draw


def with_static_shape(out: Any, dims: list[Any]) -> Any:
    """``out`` with the static shape ``dims`` promise (a sliced draw loses it).

    Example:
        >>> with_static_shape(rows_of_global(dims, draw), dims)         # doctest: +SKIP
    """
    import tensorflow as tf

    static = [d if isinstance(d, int) else tf.get_static_value(d) for d in dims]
    out.set_shape([None if d is None else int(d) for d in static])
    return out


def make_dropout(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap Keras's TF-backend ``dropout``: the mask is this replica's rows of one device's.

    Example:
        >>> from keras.src.backend.tensorflow import random   # doctest: +SKIP
        >>> patched = make_dropout(random.dropout)              # doctest: +SKIP
    """

    def dropout(inputs: Any, rate: Any, noise_shape: Any = None, seed: Any = None) -> Any:
        if step_rows.current() is None or isinstance(rate, (int, float)) and rate in (0.0, 1.0):
            return original(inputs, rate, noise_shape=noise_shape, seed=seed)
        import tensorflow as tf
        from keras.src.backend.tensorflow import random as tf_random
        from tensorflow.python.ops import stateless_random_ops

        drawn = _drawn_seed(seed)
        concrete = tf_random._get_concrete_noise_shape(inputs, noise_shape)
        dims = shape_list(concrete)
        if dims is None:
            return original(inputs, rate, noise_shape=noise_shape, seed=drawn)
        seed_value = tf_random._cast_seed(drawn.next())

        def uniform(shape: Any, dtype: Any) -> Any:
            # What stateless_dropout's sampler draws, at the shape asked for.
            return stateless_random_ops.stateless_random_uniform(
                shape=shape, dtype=dtype, seed=seed_value, alg=None)

        x = tf.convert_to_tensor(inputs)

        def sampler(shape: Any, dtype: Any) -> Any:
            out = rows_of_global(dims, lambda d: uniform(d, dtype))
            return uniform(shape, dtype) if out is None else with_static_shape(out, dims)

        # TensorFlow's own dropout arithmetic (stateless_dropout's) around the sampler.
        return tf.nn.experimental.general_dropout(x, rate, uniform_sampler=sampler,
                                                  noise_shape=concrete)

    return dropout


def make_categorical(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap Keras's TF-backend ``categorical``: each row samples from its one-device place.

    Example:
        >>> from keras.src.backend.tensorflow import random   # doctest: +SKIP
        >>> patched = make_categorical(random.categorical)      # doctest: +SKIP
    """

    def categorical(logits: Any, num_samples: Any, dtype: str = "int64", seed: Any = None) -> Any:
        if step_rows.current() is None:
            return original(logits, num_samples, dtype=dtype, seed=seed)
        import tensorflow as tf

        logits = tf.convert_to_tensor(logits)
        drawn = _drawn_seed(seed)
        if logits.shape.rank != 2:
            return original(logits, num_samples, dtype=dtype, seed=drawn)
        rows = tf.shape(logits, out_type=tf.int32)[0]
        dims = [rows if logits.shape[0] is None else int(logits.shape[0]), num_samples]

        def full(_dims: list[Any], offset: Any, total: Any) -> Any:
            # Other replicas' rows are zeros here: a row's sample depends only
            # on its own logits and its place in the random stream.
            padded = tf.pad(logits, [[offset, total - offset - rows], [0, 0]])
            return original(padded, num_samples, dtype=dtype, seed=drawn)[offset:offset + rows]

        out = rows_of_global(dims, lambda _d: original(logits, num_samples, dtype=dtype,
                                                        seed=drawn), full)
        if out is None:
            return original(logits, num_samples, dtype=dtype, seed=drawn)
        return with_static_shape(out, dims) if isinstance(num_samples, int) else out

    return categorical
