"""Pretrained backbone weights for ``mirrorkit train --weights``: ImageNet or a local file.

``--weights`` accepts:

* ``imagenet``: Keras's own ImageNet weights of the application, downloaded
  once into Keras's cache (``$KERAS_HOME/models``, default ``~/.keras``).
  The workers of one machine take turns on a lock file
  (``fcntl.flock``, one per application, in the temporary folder): the first
  downloads, the others wait and then read the cached file, so the weights
  are fetched once per machine. A failed download is one line naming the
  URL and the reason, and suggesting ``--weights PATH``.
* ``PATH.weights.h5``: the backbone's own weights, as
  ``keras.applications.X(include_top=False, pooling="avg", input_shape=(H, W, 3),
  weights=None).save_weights(PATH)`` writes them (the same application and
  options; any image size for convolutional backbones). Also ``PATH.h5``:
  Keras's own ImageNet file of the application without its top (the
  ``..._notop.h5`` in ``~/.keras/models`` of a machine that downloaded it),
  for machines offline.
* ``PATH.keras``: a saved model that is the backbone, or holds it: the
  ``model.keras`` of an earlier ``mirrorkit train --model X`` run (its
  ``backbone`` layer), or any model with a nested sub-model whose weights
  have the backbone's shapes.

A file that does not fit is one line: what was expected (arrays and
values of the backbone) and what was found. The weights are read into
NumPy arrays before the strategy's scope, then assigned to the backbone
built inside it, identically on every worker.

Example:
    >>> check_weights_spec("imagenet"), check_weights_spec("runs/a/model.keras")
    ('imagenet', 'runs/a/model.keras')
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

from mirrorkit.errors import RunError, UserInputError
from mirrorkit.training.backbones import Application, make_backbone
from mirrorkit.training.file_turns import taking_turns

logger = logging.getLogger(__name__)

IMAGENET = "imagenet"
_SUFFIXES = (".h5", ".keras")


def check_weights_spec(spec: Any) -> str:
    """Validate ``--weights`` without touching the file system or TensorFlow.

    Raises:
        UserInputError: anything but ``imagenet`` or a path ending in
            ``.h5`` (``.weights.h5``) or ``.keras``.

    Example:
        >>> check_weights_spec("backbone.pt")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `weights` must be 'imagenet', a backbone's .weights.h5 (or Keras's ImageNet .h5) file or a .keras model. Received: weights='backbone.pt'
    """
    if not isinstance(spec, str) or not (spec == IMAGENET or spec.endswith(_SUFFIXES)):
        raise UserInputError(f"`weights` must be 'imagenet', a backbone's .weights.h5 (or Keras's "
                             f"ImageNet .h5) file or a .keras model. Received: weights={spec!r}")
    return spec


def backbone_arrays(spec: str, app: Application, image_size: tuple[int, int]) -> list[Any]:
    """The backbone's weights named by ``spec``, as NumPy arrays in ``backbone.weights`` order.

    Build the backbone outside any strategy scope (a throwaway copy); call
    before entering the scope.

    Raises:
        FileNotFoundError: the file is missing.
        UserInputError: the file does not fit the backbone (expected and found named).
        RunError: the ImageNet weights could not be downloaded.

    Example:
        >>> arrays = backbone_arrays("b.weights.h5", APPLICATIONS["mobilenet_025"], (32, 32))  # doctest: +SKIP
    """
    check_weights_spec(spec)
    if spec == IMAGENET:
        with _machine_lock(app):
            backbone = _download(app, image_size)
        return backbone.get_weights()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"The --weights file does not exist. Received: weights={spec!r}")
    backbone = make_backbone(app, image_size)
    if spec.endswith(".keras"):
        return _from_model_file(path, backbone, app, image_size)
    try:
        with warnings.catch_warnings():
            # Keras warns per layer it cannot fill before it raises: the
            # error below says it in one line.
            warnings.simplefilter("ignore", UserWarning)
            backbone.load_weights(str(path))
    except Exception as err:  # noqa: BLE001 -- h5py/Keras mismatch errors vary by version
        raise UserInputError(f"--weights {spec} does not fit {app.name}: expected "
                             f"{_describe(backbone, app, image_size)}; found {_h5_contents(path)} "
                             f"({_first_line(err)})") from err
    return backbone.get_weights()


def _download(app: Application, image_size: tuple[int, int]) -> Any:
    try:
        with warnings.catch_warnings():
            # "Weights for input shape (224, 224) will be loaded": true and
            # harmless for a backbone without its top.
            warnings.simplefilter("ignore", UserWarning)
            return make_backbone(app, image_size, weights=IMAGENET)
    except ValueError as err:
        # Keras's own argument errors (e.g. an image size it has no weights for):
        # about the user's --model and --image-size, so their one line.
        raise UserInputError(str(err)) from err
    except Exception as err:  # noqa: BLE001 -- get_file raises a bare Exception
        text = " ".join(str(err).split())
        found = re.search(r"https?://\S+?(?=:?\s|$)", text)
        url = found.group(0).rstrip(":") if found else "Keras's URL"
        reason = text.split(" -- ", 1)[-1] if " -- " in text else text
        raise RunError(f"could not download the imagenet weights of {app.name} from {url}: "
                       f"{reason}; pass --weights PATH of a local file") from err


@contextlib.contextmanager
def _machine_lock(app: Application) -> Iterator[None]:
    """Workers of one machine take turns: the first downloads, the others find the cached file."""
    digest = hashlib.sha1(f"{app.constructor}{app.options}".encode()).hexdigest()[:12]
    with taking_turns(Path(tempfile.gettempdir()) / f"mirrorkit-weights-{digest}.lock"):
        yield


def _from_model_file(path: Path, backbone: Any, app: Application,
                     image_size: tuple[int, int]) -> list[Any]:
    import keras

    try:
        saved = keras.models.load_model(str(path), compile=False)
    except Exception as err:  # noqa: BLE001 -- zip/JSON/deserialisation errors
        raise UserInputError(f"--weights {path} is not a loadable .keras model "
                             f"({_first_line(err)}); expected a model holding "
                             f"{_describe(backbone, app, image_size)}") from err
    want = [tuple(w.shape) for w in backbone.weights]
    candidates = [saved, *_nested(saved)]
    for candidate in candidates:
        if [tuple(w.shape) for w in candidate.weights] == want:
            return candidate.get_weights()
    found = "; ".join(f"{c.name!r}: {len(c.weights)} arrays, {_values(c):,} values"
                      for c in candidates[:4])
    raise UserInputError(f"--weights {path} does not fit {app.name}: expected a model or "
                         f"sub-model with {_describe(backbone, app, image_size)}; found {found}")


def _nested(model: Any) -> Iterator[Any]:
    import keras

    for layer in getattr(model, "layers", []):
        if isinstance(layer, keras.Model):
            yield layer
            yield from _nested(layer)


def _values(model: Any) -> int:
    return int(sum(int(w.numpy().size) for w in model.weights))


def _describe(backbone: Any, app: Application, image_size: tuple[int, int]) -> str:
    height, width = image_size
    return (f"the {len(backbone.weights)} arrays ({_values(backbone):,} values) of "
            f"{app.description} without its top for {height}x{width}x3 images")


def _h5_contents(path: Path) -> str:
    try:
        import h5py

        sizes: list[int] = []
        with h5py.File(path, "r") as handle:
            handle.visititems(lambda _n, obj: sizes.append(int(obj.size))
                              if isinstance(obj, h5py.Dataset) else None)
        return f"{len(sizes)} arrays ({sum(sizes):,} values)"
    except Exception as err:  # noqa: BLE001 -- not HDF5 at all, truncated, ...
        return f"no readable HDF5 weights ({_first_line(err)})"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
