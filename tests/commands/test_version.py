"""One version string: mirrorkit/_version.py, seen the same by pip, Python and the CLI."""

from __future__ import annotations

import importlib.metadata

import pytest
from click.testing import CliRunner
from conftest import REPO

import mirrorkit
from mirrorkit._version import __version__
from mirrorkit.cli import cli


def test_installed_metadata_version_is_mirrorkit_version():
    assert importlib.metadata.version("mirrorkit") == mirrorkit.__version__ == __version__


def test_mirrorkit_version_option_prints_it():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"mirrorkit, version {__version__}"


def test_pyproject_reads_the_version_instead_of_repeating_it():
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in data["project"] and "version" in data["project"]["dynamic"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "mirrorkit._version.__version__"}
    assert f'"{__version__}"' not in (REPO / "mirrorkit" / "__init__.py").read_text()
