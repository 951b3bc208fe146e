"""The files of one ``agentrl eval`` and resuming an interrupted one: :class:`EvalStore`.

Owns, for an eval writing ``X.jsonl`` (see ``agentrl.jobs.eval``): ``X.config.json`` (the settings
that decide what is measured, written before the first episode), ``X.episodes.jsonl`` (every finished
episode, appended and flushed the moment it finishes, so a kill or a crash loses only the episodes in
flight), the chat rows of ``X.jsonl`` (appended likewise), and at the end both files rewritten from the
final episode list (temp file + rename: every ``(task, attempt)`` once, in order) and ``X.summary.json``.

Resuming (``resume=True``): the previous ``X.config.json`` must hold the same settings (:data:`SAME`;
``n`` and ``attempts`` may grow, never shrink: tasks and their seeds do not depend on ``n``), else a
``ConfigError`` names each differing setting with both values. Every ``(task, attempt)`` that finished
with a trainable outcome is kept; one that ended with an infrastructure outcome, or never finished, runs
again. A torn last line (a kill mid-write) is ignored. Without anything to resume the eval starts
afresh. Without ``resume`` the files are overwritten, as before resuming existed.

Does not run episodes or compute the summary (``agentrl.jobs.eval``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from agentrl.common.llm_api import redact
from agentrl.errors import ConfigError
from agentrl.trajectory import Outcome, json_text

#: the settings a resumed eval must share with the one it continues (n and attempts may grow)
SAME = ("env", "env_kwargs", "model", "api_base", "sampling", "seed", "max_turns", "score_truncated")
GROWS = ("n", "attempts")

Pair = tuple[int, int]  # (task index, attempt)


def output_paths(out: str | Path) -> tuple[Path, Path, Path]:
    """``X.jsonl`` -> (chat rows, ``X.episodes.jsonl``, ``X.summary.json``)."""
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out, out.with_name(stem + ".episodes.jsonl"), out.with_name(stem + ".summary.json")


def jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` of each non-blank line of ``path``; a last line that is not JSON (torn by
    a kill mid-write) is skipped, one before it is a ``ValueError`` naming the file and line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):
                return
            raise ValueError(f"{path}:{lineno}: not JSON: {e}") from None
        yield lineno, row


def settings_mismatch(before: dict, now: dict) -> list[str]:
    """What keeps ``now`` from continuing an eval run with ``before``: one line per setting."""
    out = [
        f"{k}: {before.get(k)!r} before, {now.get(k)!r} now"
        for k in SAME
        if json.dumps(before.get(k), sort_keys=True) != json.dumps(now.get(k), sort_keys=True)
    ]
    out += [
        f"{k}: {now.get(k)!r} is fewer than the {before.get(k)!r} it ran with (it may only grow)"
        for k in GROWS
        if isinstance(before.get(k), int) and now.get(k, 0) < before[k]
    ]
    return out


def finished_pairs(path: Path, make: Callable[[dict], Any]) -> dict[Pair, Any]:
    """The episodes of ``path`` by ``(index, attempt)`` (``make`` builds one from its row): per pair the
    last one with a trainable outcome, else the last one (an infrastructure failure, to run again)."""
    out: dict[Pair, Any] = {}
    for _, row in jsonl_rows(path):
        ep = make(row)
        pair = (ep.index, ep.attempt)
        old = out.get(pair)
        if old is None or Outcome(ep.outcome).trainable or not Outcome(old.outcome).trainable:
            out[pair] = ep
    return out


class EvalStore:
    """The files of one eval (module docstring). ``paths``: chat, episodes, summary (``output_paths``)."""

    def __init__(self, paths: tuple[Path, Path, Path], settings: dict, keep: Callable[[Any], bool]) -> None:
        self.chat, self.episodes, self.summary = paths
        self.config = self.summary.with_name(self.summary.name.replace(".summary.json", ".config.json"))
        self.settings, self.keep = settings, keep
        self._files: list[IO[str]] = []

    def open(self, resume: bool, make: Callable[[dict], Any]) -> dict[Pair, Any]:
        """Start writing; with ``resume`` the previous eval's finished episodes (each with a trainable
        outcome), to be skipped. ConfigError when they were run with other settings."""
        done: dict[Pair, Any] = {}
        if resume and self.episodes.exists():
            done = self._previous(make)
        self.chat.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(redact(json.dumps(self.settings, indent=2, default=str)))
        mode = "a" if resume else "w"
        self._files = [open(self.chat, mode, encoding="utf-8"), open(self.episodes, mode, encoding="utf-8")]
        return done

    def _previous(self, make: Callable[[dict], Any]) -> dict[Pair, Any]:
        if not self.config.exists():
            raise ConfigError(
                f"cannot resume {self.episodes}: {self.config} (the settings it ran with) is missing; "
                "run it again without --resume"
            )
        before = json.loads(self.config.read_text(encoding="utf-8"))
        now = json.loads(redact(json.dumps(self.settings, default=str)))  # as it would be written
        why = settings_mismatch(before, now)
        if why:
            raise ConfigError(
                f"cannot resume {self.episodes}: it ran with other settings ({'; '.join(why)}); "
                "run with the same settings, or without --resume (or another --out) to start afresh"
            )
        return {p: ep for p, ep in finished_pairs(self.episodes, make).items() if Outcome(ep.outcome).trainable}

    def record(self, ep: Any) -> None:
        """Append a finished episode (and its chat row when ``keep`` takes it), flushed."""
        if not self._files:
            return
        chat, episodes = self._files
        if self.keep(ep):
            chat.write(redact(json_text(ep.chat_row())) + "\n")
            chat.flush()
        episodes.write(redact(json_text(ep.__dict__, default=str)) + "\n")
        episodes.flush()

    def close(self) -> None:
        for fh in self._files:
            fh.close()
        self._files = []

    def finish(self, episodes: list[Any], summary: dict) -> None:
        """Rewrite the chat and episode files from ``episodes`` (each pair once) and write ``summary``."""
        self.close()
        _replace(self.episodes, (json_text(e.__dict__, default=str) for e in episodes))
        _replace(self.chat, (json_text(e.chat_row()) for e in episodes if self.keep(e)))
        self.summary.write_text(redact(json.dumps(summary, indent=2, default=str)))

    def names(self) -> dict[str, str]:
        return {"chat": str(self.chat), "episodes": str(self.episodes), "summary": str(self.summary)}


def _replace(path: Path, lines: Iterator[str]) -> None:
    """Write ``lines`` (redacted) to ``path`` through a temp file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for line in lines:
            fh.write(redact(line) + "\n")
    tmp.replace(path)
