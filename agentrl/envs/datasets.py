"""Load user task files (JSONL, JSON, parquet) into task dicts, veRL's parquet layout included.

Owns: ``load_tasks(path, ...) -> TaskDataset`` and ``read_rows(path)`` (the rows as written, for
adapters of peer envs that read their own fields). ``load_tasks`` makes each row a task dict
``{id, prompt, answer, difficulty: None, kind: "dataset", data_source, extra_info}`` plus
``tests``/``entry_point`` when the row has them. Accepted row shapes:

* plain: ``{"prompt": str | [{"role", "content"}, ...], "answer": ..., "id"?: ...}``
* veRL: ``{"prompt": [messages], "reward_model": {"ground_truth": ..., "style": "rule"},
  "data_source": str, "extra_info": {...}}`` (``answer`` wins over ``ground_truth`` if both exist)
* unit-test tasks: ``tests`` (list of assert strings) and ``entry_point``; ``answer`` optional.

Numbers as answers become strings (NaN and infinities are rejected). Files are UTF-8, a leading
byte-order mark accepted; binary bytes, rows nested deeper than ``agentrl.common.bounded.MAX_DEPTH`` and
integers of more than 4,300 digits are bad rows, not crashes. A row that cannot be used raises ``DatasetError``
naming the
file and the row (``line N`` for JSONL, 1-based; ``row N`` for parquet/JSON, 0-based), or, with
``on_bad_row="skip"``, is dropped and counted in ``TaskDataset.skipped``. Loads are cached by
(path, mtime, size, options): envs are built per episode and must not re-read a file each time.

Does not: tokenize, shuffle, split or score (rewards live in ``agentrl.envs.rewards``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.common.bounded import BadText, decode, finite_error, parse_text
from agentrl.errors import DatasetError

_ROLES = {"system", "user", "assistant", "tool"}
_CACHE: dict[tuple, TaskDataset] = {}
_CACHE_MAX = 8


@dataclass
class TaskDataset(Sequence):
    """Tasks loaded from ``path``; ``skipped`` counts bad rows dropped under ``on_bad_row="skip"``."""

    path: str
    tasks: list[dict] = field(default_factory=list)
    skipped: int = 0
    skip_reasons: list[str] = field(default_factory=list)  # the first few, for the log

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, i):  # type: ignore[override]
        return self.tasks[i]


class _BadRow(Exception):
    pass


def _messages(prompt: Any) -> list[dict]:
    if hasattr(prompt, "tolist"):  # numpy arrays from pandas-written parquet
        prompt = prompt.tolist()
    if not isinstance(prompt, list) or not prompt:
        raise _BadRow("'prompt' must be a non-empty string or a non-empty list of chat messages")
    out = []
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise _BadRow(f"prompt message {j} must be an object with string 'role' and 'content'")
        if m["role"] not in _ROLES:
            raise _BadRow(f"prompt message {j} has unknown role {m['role']!r}")
        out.append({"role": m["role"], "content": m["content"]})
    if not any(m["role"] == "user" for m in out):
        raise _BadRow("prompt messages contain no 'user' message")
    return out


def _answer(row: dict) -> Any:
    if "answer" in row and row["answer"] is not None:
        value = row["answer"]
    else:
        rm = row.get("reward_model")
        if rm is None:
            return None
        if not isinstance(rm, dict):
            raise _BadRow("'reward_model' must be an object")
        style = rm.get("style", "rule")
        if style != "rule":
            raise _BadRow(f"reward_model.style {style!r} is not supported (only 'rule')")
        value = rm.get("ground_truth")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _BadRow(f"answer must be a string or a number, got {type(value).__name__}")
    if finite_error(value):
        raise _BadRow(f"answer {value!r} is not a finite number")
    value = str(value).strip()
    if not value:
        raise _BadRow("answer is empty")
    return value


def row_to_task(row: Any, index: int, stem: str) -> dict:
    """One raw row -> task dict; raises ``_BadRow`` (turned into DatasetError by the loader)."""
    if not isinstance(row, dict):
        raise _BadRow(f"row must be an object, got {type(row).__name__}")
    if "prompt" not in row or row["prompt"] is None:
        raise _BadRow("missing 'prompt'")
    prompt = row["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise _BadRow("'prompt' is empty")
    else:
        prompt = _messages(prompt)
    task: dict[str, Any] = {"id": None, "prompt": prompt, "answer": _answer(row), "difficulty": None, "kind": "dataset"}
    tests = row.get("tests")
    if tests is not None:
        if hasattr(tests, "tolist"):
            tests = tests.tolist()
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise _BadRow("'tests' must be a non-empty list of strings")
        if not isinstance(row.get("entry_point"), str) or not row["entry_point"]:
            raise _BadRow("a row with 'tests' needs an 'entry_point' (the function name)")
        task["tests"], task["entry_point"] = list(tests), row["entry_point"]
    elif task["answer"] is None:
        raise _BadRow("missing 'answer' (or reward_model.ground_truth, or tests + entry_point)")
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise _BadRow("'extra_info' must be an object")
    task["data_source"] = str(row.get("data_source") or stem)
    task["extra_info"] = json.loads(json.dumps(extra, default=str))  # JSON-able, detached from pyarrow
    rid = row.get("id", extra.get("index"))
    task["id"] = str(rid) if rid is not None else f"{stem}-{index}"
    return task


def _read_rows(path: Path):
    """Yield (label, row) with a human label for error messages."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        with open(path, "rb") as f:  # bytes: a binary line is a bad row, not a crash of the reader
            for n, raw in enumerate(f, 1):
                try:
                    line = decode(raw)
                    if not line.strip():
                        continue
                    yield f"line {n}", parse_text(line, json.loads)
                except BadText as e:
                    yield f"line {n}", _BadRow(str(e))
                except json.JSONDecodeError as e:
                    yield f"line {n}", _BadRow(f"invalid JSON: {e.msg} at column {e.colno}")
    elif suffix == ".json":
        try:
            data = parse_text(decode(path.read_bytes()), json.loads)
        except BadText as e:
            raise DatasetError(f"{path}: {e}") from None
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}: invalid JSON: {e}") from e
        if not isinstance(data, list):
            raise DatasetError(f"{path}: a .json dataset must hold a list of rows")
        yield from ((f"row {i}", r) for i, r in enumerate(data))
    elif suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise DatasetError(f"{path}: cannot read parquet: {e}") from e
        yield from ((f"row {i}", r) for i, r in enumerate(table.to_pylist()))
    else:
        raise DatasetError(f"{path}: unknown dataset format {suffix!r} (use .jsonl, .json or .parquet)")


def read_rows(path: str | os.PathLike) -> list[tuple[str, dict]]:
    """The raw rows of a .jsonl/.json/.parquet file as written, each with its label (``line N`` /
    ``row N``), for envs that take a whole row (a peer trainer's env reading its own fields).
    DatasetError naming the file and row for a row that is unreadable or not an object; not cached."""
    p = Path(path).expanduser()
    if not p.is_file() and p.suffix.lower() not in (".parquet", ".pq"):
        raise DatasetError(f"{p}: cannot open dataset: no such file")
    out = []
    for label, row in _read_rows(p):
        if isinstance(row, _BadRow) or not isinstance(row, dict):
            raise DatasetError(f"{p}: {label}: {row if isinstance(row, _BadRow) else 'row must be an object'}")
        out.append((label, row))
    return out


def load_tasks(path: str | os.PathLike, *, on_bad_row: str = "error", limit: int | None = None) -> TaskDataset:
    """Read ``path`` into a ``TaskDataset`` (cached; treat the result as read-only)."""
    if on_bad_row not in ("error", "skip"):
        raise DatasetError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise DatasetError(f"{p}: cannot open dataset: {e.strerror or e}") from e
    if p.is_dir() and p.suffix.lower() not in (".parquet", ".pq"):  # pyarrow reads a directory of parquet parts
        raise DatasetError(f"{p}: is a directory, not a dataset file")
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size, on_bad_row, limit)
    if key in _CACHE:
        return _CACHE[key]
    ds = TaskDataset(path=str(p))
    for i, (label, row) in enumerate(_read_rows(p)):
        if limit is not None and len(ds.tasks) >= limit:
            break
        try:
            if isinstance(row, _BadRow):
                raise row
            ds.tasks.append(row_to_task(row, i, p.stem))
        except _BadRow as e:
            if on_bad_row == "error":
                raise DatasetError(f"{p}: {label}: {e}") from None
            ds.skipped += 1
            if len(ds.skip_reasons) < 5:
                ds.skip_reasons.append(f"{label}: {e}")
    if not ds.tasks:
        raise DatasetError(f"{p}: no usable rows" + (f" ({ds.skipped} skipped)" if ds.skipped else ""))
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = ds
    return ds
