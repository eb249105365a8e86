"""Argument checks shared by every layer, with the Keras-style message.

Example:
    >>> check_positive_int("shards", 4)
    4
"""

from __future__ import annotations

import numbers
from typing import Any

from mirrorkit.errors import UserInputError


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` as an int, or raise the Keras-style ``UserInputError``.

    Example:
        >>> check_positive_int("epochs", 0)
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `epochs` must be a positive integer. Received: epochs=0
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UserInputError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)
