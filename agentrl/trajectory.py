"""The data contract between rollouts and training: one Trajectory per episode.

Owns: the Trajectory/TurnRecord records, the typed Outcome, validation of the per-token
arrays, and lossless round-trips to JSONL and parquet (of valid text: strings are written as
valid UTF-8, lone surrogates replaced; see ``json_text``). Does not build trajectories (the
episode manager does) nor compute advantages (the learning code does).

Per-token arrays (all of length ``len(token_ids)``):

* ``token_ids``  - the prompt ids, then for each turn the ids exactly as the engine sampled
  them followed by the exact delta ids appended for the observation. Never re-tokenized.
* ``loss_mask``  - 1 for a token sampled by the policy, 0 for prompt, template glue, tool output.
* ``logprobs``   - the engine's behaviour log-probability of each sampled token; 0.0 where mask is 0.
* ``turn_ids``   - the assistant turn a token belongs to: the turn that sampled it or the turn
  whose observation it is; -1 for the initial prompt.
* ``versions``   - the policy version that sampled the token; -1 where mask is 0.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Outcome(str, enum.Enum):
    """How an episode ended. Only ``ok`` and the ``truncated_*``/``context_overflow`` outcomes are
    trainable; the ``*_error``/``tool_timeout`` outcomes are infrastructure failures, excluded."""

    OK = "ok"
    TRUNCATED_TURNS = "truncated_turns"  # hit max_turns
    TRUNCATED_LENGTH = "truncated_length"  # a turn hit max_new_tokens / the episode token budget
    CONTEXT_OVERFLOW = "context_overflow"  # the next request would not fit the context budget
    TOOL_TIMEOUT = "tool_timeout"
    SANDBOX_ERROR = "sandbox_error"
    ENGINE_ERROR = "engine_error"
    ENV_ERROR = "env_error"
    REWARD_ERROR = "reward_error"
    CANCELLED = "cancelled"
    DEADLINE = "deadline"  # per-episode wall-clock deadline

    @property
    def trainable(self) -> bool:
        return self in _TRAINABLE


_TRAINABLE = {Outcome.OK, Outcome.TRUNCATED_TURNS, Outcome.TRUNCATED_LENGTH, Outcome.CONTEXT_OVERFLOW}


@dataclass
class TurnRecord:
    """What happened in one assistant turn."""

    index: int
    start: int  # offset of the turn's first sampled token in token_ids
    n_sampled: int
    n_observation: int
    finish_reason: str  # "stop" | "length" | "abort"
    reward: float = 0.0
    gen_s: float = 0.0  # time waiting for the engine
    env_s: float = 0.0  # time in env.step (tools included)
    tool_calls: int = 0
    tool_errors: int = 0  # calls answered with an error message (model mistakes)
    #: the state the turn started from: the env's ``state_key()``, else ``"obs:"`` + a hash of the
    #: observation text before the turn (GiGPO's anchor states); None in trajectories written before it
    state_key: str | None = None


@dataclass
class Trajectory:
    """One finished episode, token-exact. See the module docstring for the per-token arrays."""

    episode_id: str
    group_id: str
    env_id: str
    prompt_len: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    outcome: Outcome = Outcome.OK
    outcome_detail: str = ""
    sample_index: int = 0
    task: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)  # text log, informational only
    #: the tool schemas the episode advertised to the model (what its prompt rendered), for chat
    #: exports (``agentrl export-sft``); empty when it had none or in trajectories written before it
    tools: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    # -- derived -------------------------------------------------------------------------
    @property
    def turn_rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def trainable(self) -> bool:
        return Outcome(self.outcome).trainable

    def validate(self) -> None:
        """Raise ValueError if the per-token arrays disagree with each other."""
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "turn_ids", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"trajectory {self.episode_id}: len({name})={len(getattr(self, name))} != len(token_ids)={n}"
                )
        if any(m for m in self.loss_mask[: self.prompt_len]):
            raise ValueError(f"trajectory {self.episode_id}: prompt tokens must have loss_mask 0")
        for i, m in enumerate(self.loss_mask):
            if m not in (0, 1):
                raise ValueError(f"trajectory {self.episode_id}: loss_mask[{i}]={m!r} is not 0/1")
            if m == 0 and self.versions[i] != -1:
                raise ValueError(f"trajectory {self.episode_id}: versions[{i}] set on a mask-0 token")
        if sum(t.n_sampled + t.n_observation for t in self.turns) + self.prompt_len != n:
            raise ValueError(f"trajectory {self.episode_id}: turn records do not add up to {n} tokens")

    # -- serialization -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["outcome"] = Outcome(self.outcome).value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["turns"] = [TurnRecord(**t) for t in d.get("turns", [])]
        d["outcome"] = Outcome(d.get("outcome", "ok"))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown trajectory fields: {sorted(unknown)}")
        return cls(**d)


# JSON stores repr(float), which round-trips float64 exactly (NaN/inf included, as Python's json
# extension). Parquet stores the same values as float64 columns plus JSON for nested records.
# Strings are written as valid UTF-8 (see json_text): the one lossy step, and only for text that
# has no UTF-8 form at all. Token ids, not text, are the trajectory's exact record.

_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (a well-formed pair becomes its character),
    so it encodes as UTF-8. Model output gets them from JSON ``\\ud83d`` escapes."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def json_text(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False)`` whose every string is valid UTF-8 (``valid_text``):
    what every JSON writer of trajectories, logs and eval records uses."""
    return valid_text(json.dumps(obj, ensure_ascii=False, **kwargs))


def _fields_view(t: Trajectory) -> dict[str, Any]:
    """``t.to_dict()`` without its deep copy, for writers that only read it: ``asdict`` copies every
    per-token list element by element (70 ms for an 8k-token trajectory, most of a written episode)."""
    d = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    d["turns"] = [dataclasses.asdict(r) for r in t.turns]
    d["outcome"] = Outcome(t.outcome).value
    return d


def write_jsonl(path: str | Path, trajs: Iterable[Trajectory], append: bool = False) -> int:
    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for t in trajs:
            f.write(json_text(_fields_view(t)) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Trajectory.from_dict(json.loads(line))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a trajectory: {e}") from e


_NESTED = ("turns", "task", "messages", "tools", "info")


def write_parquet(path: str | Path, trajs: Iterable[Trajectory]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for t in trajs:
        d = _fields_view(t)
        for k in _NESTED:
            d[k] = json_text(d[k])
        for k in ("episode_id", "group_id", "env_id", "outcome_detail"):
            d[k] = valid_text(d[k])
        rows.append(d)
    schema = pa.schema(
        [
            ("episode_id", pa.string()),
            ("group_id", pa.string()),
            ("env_id", pa.string()),
            ("prompt_len", pa.int64()),
            ("token_ids", pa.list_(pa.int64())),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("turn_ids", pa.list_(pa.int32())),
            ("versions", pa.list_(pa.int64())),
            ("turns", pa.string()),
            ("reward", pa.float64()),
            ("outcome", pa.string()),
            ("outcome_detail", pa.string()),
            ("sample_index", pa.int64()),
            ("task", pa.string()),
            ("messages", pa.string()),
            ("tools", pa.string()),
            ("info", pa.string()),
            ("wall_s", pa.float64()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(path))
    return len(rows)


def read_parquet(path: str | Path) -> Iterator[Trajectory]:
    import pyarrow.parquet as pq

    for d in pq.read_table(str(path)).to_pylist():
        for k in _NESTED:
            if k in d:  # "tools" is absent from files written before it
                d[k] = json.loads(d[k])
        yield Trajectory.from_dict(d)


def save(path: str | Path, trajs: Iterable[Trajectory]) -> int:
    """Write trajectories; the format follows the suffix (.jsonl or .parquet)."""
    p = Path(path)
    if p.suffix == ".parquet":
        return write_parquet(p, trajs)
    return write_jsonl(p, trajs)


def load(path: str | Path) -> list[Trajectory]:
    p = Path(path)
    return list(read_parquet(p) if p.suffix == ".parquet" else read_jsonl(p))
