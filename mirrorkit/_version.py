"""mirrorkit's version: the one place it is written.

In a module of its own so any layer can read it without import cycles.
``pyproject.toml`` reads it at build time (``[tool.setuptools.dynamic]``), so the
installed metadata, ``mirrorkit.__version__`` and ``mirrorkit --version`` agree.

Example:
    >>> from mirrorkit._version import __version__
    >>> __version__.count(".") >= 2
    True
"""

__version__ = "0.1.0"
