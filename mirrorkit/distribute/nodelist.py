"""Slurm's compact host and task-count notations, expanded (pure string parsing).

Example:
    >>> expand_nodelist("node[01-02],gpu7")
    ['node01', 'node02', 'gpu7']
    >>> expand_tasks_per_node("2(x3),1")
    [2, 2, 2, 1]
"""

from __future__ import annotations

import re

from mirrorkit.errors import UserInputError

_TASKS_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_nodelist(text: str) -> list[str]:
    """Expand a compact Slurm node list, keeping Slurm's order.

    Supports comma-separated entries, bracketed ranges and single numbers
    with zero padding (``01-03``), and several bracket groups in one name
    (``rack[1-2]-n[1-2]``, expanded left-major).

    Args:
        text: e.g. ``"node[01-03,07],gpu5"``.

    Returns:
        The host names, e.g. ``['node01', 'node02', 'node03', 'node07', 'gpu5']``.

    Raises:
        UserInputError: for an empty list, unbalanced brackets or a bad range.

    Example:
        >>> expand_nodelist("node[01-03,07],gpu5")
        ['node01', 'node02', 'node03', 'node07', 'gpu5']
    """
    hosts: list[str] = []
    for entry in _split_outside_brackets(text):
        hosts.extend(_expand_entry(entry, text))
    if not hosts:
        raise UserInputError(
            f"The Slurm node list names no node. Received: nodelist={text!r}"
        )
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    entries, current, depth = [], "", 0
    for char in str(text).strip():
        if char == "[":
            depth += 1
            if depth > 1:
                break
        elif char == "]":
            depth -= 1
            if depth < 0:
                break
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise UserInputError(
            f"The Slurm node list has unbalanced brackets. Received: nodelist={text!r}"
        )
    entries.append(current)
    if any(not e.strip() for e in entries):
        raise UserInputError(
            f"The Slurm node list has an empty entry. Received: nodelist={text!r}"
        )
    return [e.strip() for e in entries]


def _expand_entry(entry: str, text: str) -> list[str]:
    # Split "rack[1-2]-n[01-02]" into literal and bracket parts, then take the
    # product left-major, which is the order Slurm itself prints.
    parts = re.split(r"(\[[^\]]*\])", entry)
    names = [""]
    for part in parts:
        if part.startswith("["):
            values = _expand_ranges(part[1:-1], text)
            names = [n + v for n in names for v in values]
        else:
            names = [n + part for n in names]
    return names


def _expand_ranges(body: str, text: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        low, sep, high = item.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise UserInputError(
                f"The Slurm node list has a bad range {item!r}; expected N or N-M "
                f"with digits. Received: nodelist={text!r}"
            )
        high = high if sep else low
        if int(high) < int(low):
            raise UserInputError(
                f"The Slurm node list has a decreasing range {item!r}. "
                f"Received: nodelist={text!r}"
            )
        # Slurm pads to the width written in the list: node[01-10] -> node01..node10.
        width = len(low)
        values.extend(str(i).zfill(width) for i in range(int(low), int(high) + 1))
    return values


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's tasks-per-node notation, one count per node.

    Args:
        text: e.g. ``"2(x3),1"`` (three nodes with 2 tasks, then one with 1).

    Returns:
        The counts in node-list order.

    Raises:
        UserInputError: for anything but ``N`` or ``N(xK)`` items with N, K >= 1.

    Example:
        >>> expand_tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    counts: list[int] = []
    for item in str(text).split(","):
        match = _TASKS_RE.match(item.strip())
        if match is None or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise UserInputError(
                "Slurm tasks-per-node must be a list like '2(x3),1'. "
                f"Received: tasks_per_node={text!r}"
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
