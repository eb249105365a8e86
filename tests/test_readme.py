"""The README's Quickstart stays true: CI runs its test command verbatim."""

from __future__ import annotations

from conftest import REPO


def _bash_blocks(text: str) -> list[str]:
    blocks, inside, current = [], False, []
    for line in text.splitlines():
        if line.startswith("```bash"):
            inside, current = True, []
        elif line.startswith("```") and inside:
            inside = False
            blocks.append("\n".join(current))
        elif inside:
            current.append(line)
    return blocks


def test_quickstart_has_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = [b.strip() for b in _bash_blocks(quickstart)]
    assert len(commands) == 2, commands
    main_job, test_command = commands
    assert "mirrorkit" in main_job and "pytest" in test_command
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, "the README's test command must be a line of .ci/run"


FAST_TIER = ".venv/bin/python -m pytest -m fast"


def test_the_quickstart_names_the_fast_tier_beside_the_full_suite():
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert f"`{FAST_TIER}`" in quickstart.replace("\n", " ")
    # The marker it selects is registered (an unknown -m name would select nothing).
    assert '"fast: ' in (REPO / "pyproject.toml").read_text()
