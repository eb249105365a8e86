"""The installed versions of Keras, TensorFlow and friends, from whichever distribution provides them.

``importlib.metadata.version("tensorflow")`` raises for ``tf-nightly``, and
``version("keras")`` for ``keras-nightly``: the distribution's name is not
the module's. Everything in mirrorkit that decides by version asks here.

Example:
    >>> installed_version("surely-not-installed-pkg") is None
    True
"""

from __future__ import annotations

import functools
import importlib.metadata


def installed_version(package: str) -> str | None:
    """Version of whichever installed distribution provides ``package``, without importing it.

    ``package`` is the name users know (``"tensorflow"``, ``"keras"``,
    ``"tensorflow-datasets"``). The module it names may come from another
    distribution: ``tf-nightly``, ``tensorflow-cpu`` or ``tensorflow-gpu``
    install ``tensorflow``, ``keras-nightly`` installs ``keras``; the version
    is that distribution's. A distribution of the exact name wins when it
    provides the module.

    Example:
        >>> installed_version("surely-not-installed-pkg") is None
        True
    """
    providers = _providers().get(package.replace("-", "_"), ())
    if package in providers or not providers:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    for name in providers:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def provider(package: str) -> str | None:
    """The distribution that provides module ``package`` (``"tf-nightly"`` for ``tensorflow``).

    Example:
        >>> provider("surely-not-installed-pkg") is None
        True
    """
    providers = _providers().get(package.replace("-", "_"), ())
    if package in providers:
        return package
    return providers[0] if providers else None


@functools.lru_cache(maxsize=1)
def _providers() -> dict[str, tuple[str, ...]]:
    # Top-level module -> the distributions whose files hold it (one scan of
    # the installed metadata per process; ~0.1 s).
    return {module: tuple(dict.fromkeys(name.replace("_", "-").lower() for name in names))
            for module, names in importlib.metadata.packages_distributions().items()}
