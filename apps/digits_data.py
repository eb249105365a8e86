"""scikit-learn's ``load_digits()`` without scikit-learn: the UCI digits mirrorkit ships.

The examples here and the test scripts are written the way public Keras
scripts are, and load their data with one call. This module gives that call
the same 1,797 UCI handwritten digits scikit-learn ships, with the same arrays
and dtypes (``data`` float64 (n, 64), ``images`` float64 (n, 8, 8), ``target``
int64), read with NumPy from the copy inside the installed mirrorkit package
(mirrorkit/datasets/digits.npz), without running any mirrorkit code. With
scikit-learn installed, ``from sklearn.datasets import load_digits`` gives the
same arrays. mirrorkit does without it because Keras imports scikit-learn
whenever it is installed: about a second of CPU in every TensorFlow process.

Example:
    >>> from digits_data import load_digits     # doctest: +SKIP
    >>> load_digits().images.shape              # doctest: +SKIP
    (1797, 8, 8)
"""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np


def load_digits():
    """The digits as scikit-learn's ``load_digits()`` returns them (data, images, target)."""
    # find_spec locates the package without importing it.
    package = Path(importlib.util.find_spec("mirrorkit").origin).parent
    with np.load(package / "datasets" / "digits.npz") as raw:
        images = raw["images"].astype("float64")
        target = raw["target"].astype("int64")
    return SimpleNamespace(data=images.reshape(len(images), -1), images=images, target=target)
