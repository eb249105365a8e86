"""What a run folder's files may hold, checked as ``report`` and ``export-model`` read them.

A run folder outlives the process that wrote it: it is copied, edited by
hand, cut short by a full disk or a killed writer. Every field a reader
uses is checked here (type and range) before anything is printed or
written, so a bad file gives one ``UserInputError`` line naming the file, the
field and the value, never a traceback from deep inside a summary or a plot.
Fields a reader does not use are left alone, and a field that is absent
stays absent (older runs lack some): only a present value must be valid.

Example:
    >>> check_metrics({"accumulate": 2, "incidents": []}, "m.json")["accumulate"]
    2
    >>> check_metrics({"accumulate": "abc"}, "m.json")
    Traceback (most recent call last):
    ...
    mirrorkit.errors.UserInputError: m.json: `accumulate` must be an integer >= 1 or null. Received: accumulate='abc'
"""

from __future__ import annotations

import csv
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

from mirrorkit.errors import UserInputError

__all__ = ["read_metrics", "check_metrics", "read_history", "check_rates", "check_events",
           "check_model_archive"]

# What a .keras archive holds (keras.saving.saving_lib), for the "not a Keras archive" line.
_KERAS_MEMBERS = ("config.json", "metadata.json")
# What to do about a model.keras that cannot be read.
_REMEDY = ("Train again, or continue with `mirrorkit train --resume --output RUN_DIR` if the "
           "run kept its backup/.")
# Losses of a diverged run are written as NaN/Infinity (json) or "nan" (rollback incidents).
_NON_FINITE = ("nan", "inf", "-inf")
# Keras's CSVLogger writes NA for a metric an epoch did not log.
_MISSING = ("", "NA")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(source: str, field: str, what: str, value: Any) -> UserInputError:
    return UserInputError(f"{source}: `{field}` must be {what}. Received: {field}={_short(value)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(source: str, field: str, value: Any, low: int, *, null: bool = False) -> Any:
    if (value is None and null) or (_is_int(value) and value >= low):
        return value
    raise _bad(source, field, f"an integer >= {low}" + (" or null" if null else ""), value)


def _number(source: str, field: str, value: Any, *, low: float | None = 0.0,
            high: float | None = None, finite: bool = True, null: bool = False) -> Any:
    if value is None and null:
        return value
    if _is_number(value):
        if not math.isfinite(value):
            if not finite:
                return value
        elif (low is None or value >= low) and (high is None or value <= high):
            return value
    what = "a number" if finite else "a number (NaN allowed)"
    if low is not None and high is not None:
        what += f" in [{low:g}, {high:g}]"
    elif low is not None:
        what += f" >= {low:g}"
    raise _bad(source, field, what + (" or null" if null else ""), value)


def _text(source: str, field: str, value: Any, *, null: bool = False) -> Any:
    if (value is None and null) or isinstance(value, str):
        return value
    raise _bad(source, field, "a string" + (" or null" if null else ""), value)


def _flag(source: str, field: str, value: Any) -> Any:
    if isinstance(value, bool):
        return value
    raise _bad(source, field, "true or false", value)


def _items(source: str, field: str, value: Any, kind: type, what: str) -> list[Any]:
    """``value`` as a list (null: empty) whose every item is a ``kind`` (``object``: any)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(source, field, f"a list of {what} or null", value)
    for i, item in enumerate(value):
        if not isinstance(item, kind):
            raise _bad(source, f"{field}[{i}]", "a JSON object" if kind is dict else "a list",
                       item)
    return value


def _fields(source: str, prefix: str, record: dict[str, Any], names: tuple[str, ...]) -> None:
    missing = [name for name in names if name not in record]
    if missing:
        raise UserInputError(f"{source}: `{prefix}` lacks {', '.join(missing)} (it has "
                             f"{', '.join(sorted(record)) or 'nothing'})")


# The top-level fields the report shows, by kind; bounds are what `mirrorkit train` can write.
_TEXTS = ("model", "dataset", "optimizer", "precision", "strategy")
_INTS = {"epochs": 1, "epochs_run": 0, "initial_epoch": 0, "replicas": 1, "workers": 1,
         "per_replica_batch": 1, "global_batch": 1, "effective_batch": 1, "accumulate": 1}
_AMOUNTS = ("learning_rate", "wall_time_seconds", "images_per_second",
            "images_per_second_per_replica")


def check_metrics(metrics: Any, source: str) -> dict[str, Any]:
    """Check every field of a ``metrics.json`` the report uses; return it unchanged.

    Args:
        metrics: the parsed file.
        source: how errors name the file.

    Raises:
        UserInputError: one line naming ``source``, the field (``incidents[0].loss``) and the value.

    Example:
        >>> check_metrics({"per_worker": [{"epoch": 1, "worker_step_ms": [0], "stragglers": []}]},
        ...               "m.json")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: m.json: `per_worker[0].worker_step_ms[0]` must be a number > 0. Received: per_worker[0].worker_step_ms[0]=0
    """
    if not isinstance(metrics, dict):
        raise UserInputError(f"{source} must hold a JSON object (what `mirrorkit train` writes). "
                             f"Received: {type(metrics).__name__} {_short(metrics)}")
    m = metrics
    for name in _TEXTS:
        _text(source, name, m.get(name), null=True)
    for name, low in _INTS.items():
        _int(source, name, m.get(name), low, null=True)
    for name in _AMOUNTS:
        _number(source, name, m.get(name), null=True)
    _number(source, "val_accuracy", m.get("val_accuracy"), high=1.0, finite=False, null=True)
    _number(source, "val_loss", m.get("val_loss"), low=None, finite=False, null=True)
    for i, rate in enumerate(_items(source, "images_per_second_by_epoch",
                                    m.get("images_per_second_by_epoch"), object, "numbers")):
        _number(source, f"images_per_second_by_epoch[{i}]", rate)
    sync = m.get("weights_in_sync")
    if sync is not None:
        if not isinstance(sync, dict):
            raise _bad(source, "weights_in_sync", "a JSON object or null", sync)
        _fields(source, "weights_in_sync", sync, ("workers", "identical"))
        _int(source, "weights_in_sync.workers", sync["workers"], 1)
        _flag(source, "weights_in_sync.identical", sync["identical"])
    for i, target in enumerate(_items(source, "targets", m.get("targets"), dict, "JSON objects")):
        _fields(source, f"targets[{i}]", target, ("target", "met", "value"))
        _text(source, f"targets[{i}].target", target["target"])
        _flag(source, f"targets[{i}].met", target["met"])
        _number(source, f"targets[{i}].value", target["value"], low=None, finite=False,
                null=True)
    for i, incident in enumerate(_items(source, "incidents", m.get("incidents"), dict,
                                        "JSON objects")):
        _check_incident(source, f"incidents[{i}]", incident)
    for i, epoch in enumerate(_items(source, "per_worker", m.get("per_worker"), dict,
                                     "JSON objects")):
        _check_worker_epoch(source, f"per_worker[{i}]", epoch)
    return metrics


def _check_incident(source: str, at: str, incident: dict[str, Any]) -> None:
    kind = incident.get("kind", "rollback")   # the first rollback records had no kind
    if kind == "membership":
        names = ("replicas_before", "replicas", "per_replica_batch_before", "per_replica_batch",
                 "effective_batch_before", "effective_batch")
        _fields(source, at, incident, ("rule",) + names)
        _text(source, f"{at}.rule", incident["rule"])
        for name in names:
            _int(source, f"{at}.{name}", incident[name], 1)
        return
    if kind != "rollback":
        raise _bad(source, f"{at}.kind", "'rollback' or 'membership'", kind)
    _fields(source, at, incident, ("rollback", "cause", "loss", "epoch", "step",
                                   "restored_epoch", "learning_rate"))
    _int(source, f"{at}.rollback", incident["rollback"], 1)
    _text(source, f"{at}.cause", incident["cause"])
    for name in ("epoch", "step", "restored_epoch"):
        _int(source, f"{at}.{name}", incident[name], 0)
    _number(source, f"{at}.learning_rate", incident["learning_rate"])
    loss = incident["loss"]
    if not (_is_number(loss) or loss in _NON_FINITE):
        raise _bad(source, f"{at}.loss", f"a number or one of {', '.join(_NON_FINITE)}", loss)


def _check_worker_epoch(source: str, at: str, epoch: dict[str, Any]) -> None:
    _fields(source, at, epoch, ("epoch", "worker_step_ms", "stragglers"))
    _int(source, f"{at}.epoch", epoch["epoch"], 0)
    times = _items(source, f"{at}.worker_step_ms", epoch["worker_step_ms"], object, "numbers")
    for j, ms in enumerate(times):
        # The report divides by it: a step takes time.
        if not (_is_number(ms) and math.isfinite(ms) and ms > 0):
            raise _bad(source, f"{at}.worker_step_ms[{j}]", "a number > 0", ms)
    for j, pair in enumerate(_items(source, f"{at}.stragglers", epoch["stragglers"], list,
                                    "lists")):
        if len(pair) != 2 or not _is_int(pair[0]) or not 0 <= pair[0] < len(times):
            raise _bad(source, f"{at}.stragglers[{j}]",
                       f"[worker index below {len(times)}, ratio]", pair)


def read_metrics(path: Path) -> dict[str, Any]:
    """Read and check ``metrics.json`` (:func:`check_metrics`).

    Raises:
        UserInputError: not UTF-8 JSON, or a field of the wrong type or range.

    Example:
        >>> read_metrics(Path("runs/a/metrics.json"))["epochs"]      # doctest: +SKIP
        3
    """
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:   # RecursionError: absurdly nested JSON
        raise UserInputError(f"{path} is not valid JSON ({_one_line(err)}); it is what "
                             "`mirrorkit train` wrote, or a copy of it.") from err
    return check_metrics(metrics, str(path))


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:200] or type(err).__name__


def read_history(path: Path) -> list[dict[str, float]]:
    """The rows of ``history.csv`` (Keras's CSVLogger), numbers as floats; NA left out.

    Every row must have as many fields as the header (two rows fused on one
    line by a killed writer have more), every value be a number or NA, and
    ``epoch`` a whole number >= 0.

    Raises:
        UserInputError: one line naming the file, the line number, the column and the value.

    Example:
        >>> read_history(Path("runs/a/history.csv"))[0]["loss"]       # doctest: +SKIP
        1.5
    """
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (ValueError, csv.Error) as err:
        raise UserInputError(f"{path} is not a CSV file ({_one_line(err)}); it is the per-epoch "
                             "log `mirrorkit train` wrote.") from err
    if not rows:
        return []
    header, history = rows[0], []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise UserInputError(f"{path} line {line} has {len(row)} fields, the header has "
                                 f"{len(header)} ({','.join(header)}): two rows fused on one line "
                                 "or a row cut short. Fix or delete that line.")
        values = {}
        for name, text in zip(header, row):
            if text.strip() in _MISSING:
                continue
            try:
                values[name] = float(text)
            except ValueError:
                raise UserInputError(f"{path} line {line}: `{name}` must be a number or NA. "
                                     f"Received: {name}={_short(text)}") from None
        epoch = values.get("epoch")
        if epoch is not None and not (math.isfinite(epoch) and epoch >= 0 and epoch.is_integer()):
            raise UserInputError(f"{path} line {line}: `epoch` must be a whole number >= 0. "
                                 f"Received: epoch={_short(row[header.index('epoch')])}")
        history.append(values)
    return history


def check_rates(metrics: dict[str, Any], history: list[dict[str, float]], folder: Path) -> None:
    """``images_per_second_by_epoch`` cannot have more epochs than ``history.csv`` has rows.

    A resumed run measured its last epochs only, so fewer is normal; more
    means rows were lost or fused.

    Raises:
        UserInputError: more rates than rows.

    Example:
        >>> check_rates({"images_per_second_by_epoch": [1.0, 2.0]}, [{"epoch": 0.0}], Path("r"))
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: r/history.csv has 1 epoch row(s) but r/metrics.json `images_per_second_by_epoch` has 2 (one per epoch trained): rows of history.csv were lost or fused.
    """
    rates = metrics.get("images_per_second_by_epoch") or []
    if history and len(rates) > len(history):
        raise UserInputError(f"{folder / 'history.csv'} has {len(history)} epoch row(s) but "
                             f"{folder / 'metrics.json'} `images_per_second_by_epoch` has "
                             f"{len(rates)} (one per epoch trained): rows of history.csv were "
                             "lost or fused.")


def check_events(events: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """Check the fields of the ``restart`` events the report shows.

    Example:
        >>> check_events([{"event": "restart", "attempt": "2", "reason": "x"}], "e.jsonl")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: e.jsonl: `restart.attempt` must be an integer >= 1. Received: restart.attempt='2'
    """
    for event in events:
        if event.get("event") == "restart":
            _int(source, "restart.attempt", event.get("attempt"), 1)
            _text(source, "restart.reason", event.get("reason"))
    return events


def check_model_archive(path: Path) -> None:
    """``path`` is a whole ``.keras`` archive: a zip with Keras's config, every member intact.

    Raises:
        UserInputError: empty, truncated, not a zip / not a Keras archive, or a damaged member.

    Example:
        >>> check_model_archive(Path("runs/a/model.keras"))              # doctest: +SKIP
    """
    size = os.path.getsize(path)
    if size == 0:
        raise UserInputError(f"{path} is empty (0 bytes): the save that wrote it did not finish. "
                             f"{_REMEDY}")
    with open(path, "rb") as f:
        head = f.read(4)
    if not zipfile.is_zipfile(path):
        what = ("is truncated (a zip archive cut short at "
                f"{size} bytes)" if head == b"PK\x03\x04" else
                "is not a Keras archive (a .keras file is a zip archive; this one starts with "
                f"{head!r})")
        raise UserInputError(f"{path} {what}. {_REMEDY}")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            lacking = [n for n in _KERAS_MEMBERS if n not in names]
            if lacking:
                raise UserInputError(f"{path} is not a Keras archive: a zip without "
                                     f"{', '.join(lacking)}.")
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise UserInputError(f"{path} is damaged ({_one_line(err)}). {_REMEDY}") from err
    if damaged is not None:
        raise UserInputError(f"{path} is damaged: {damaged} fails its checksum. {_REMEDY}")
