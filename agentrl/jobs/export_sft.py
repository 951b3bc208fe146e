"""Rejection-sampling SFT data from stored episodes: what ``agentrl export-sft`` does.

Owns finding the episodes a source holds, choosing the ones that become rows (outcome ``ok`` and
reward >= ``min_reward``; infrastructure failures and truncated episodes are excluded and counted by
outcome), turning each into a chat row ``{"messages", "tools"}`` in the form
``agentrl.warmstart.chat_data.load_chat_jsonl`` reads (``agentrl sft --data``), optional dedupe of
identical rows, and the counts.

Sources: a directory (``trajectories.jsonl`` of ``agentrl rollout``, ``trajectories/step_*.jsonl``
of ``agentrl run``: the trajectories each step kept, ``logging.trajectories_per_step``; any
``*.episodes.jsonl`` of ``agentrl eval``), or one such file (``.parquet`` trajectories too; an eval's
chat file ``X.jsonl`` stands for its ``X.episodes.jsonl``).

What a row is made of: the episode's message log, which holds what the model saw and wrote — the
env's prompt, each assistant turn as the text decoded from its sampled tokens (an eval: the action
text the env parsed), each tool result as the tool message the prompt rendered (capped as the model
saw it) — and the tool schemas the episode advertised (``Trajectory.tools``, stored by the episode
manager for this; an agent-proxy trajectory's are those of the last request it recorded; an eval
episode's ``tools``). Tokens stay the source of truth for training on
rollouts; these rows are text, re-tokenized by the SFT loader with the model's chat template. An
assistant text holding Hermes ``<tool_call>`` blocks becomes an OpenAI-style message with
``tool_calls`` (ids those of the tool messages answering them) only when that is lossless: the calls
parse without error, the env answered exactly those ids, and the template form
(``agentrl.jobs.eval.render_action``: content, then one ``<tool_call>`` block per call, as the
agentrl tool prompt and Qwen2.5's template write them) gives back the text; any other text (a
```` ```python ```` block, a malformed call) stays as written, so SFT trains the format the env reads.

Does not: tokenize or train (``agentrl.warmstart``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.common.llm_api import ChatReply
from agentrl.errors import DatasetError
from agentrl.jobs.eval import render_action
from agentrl.jobs.eval_store import jsonl_rows, output_paths
from agentrl.tools.calls import parse_hermes
from agentrl.trajectory import Outcome, json_text, read_parquet

_MESSAGE_KEYS = ("role", "content", "name", "tool_call_id", "tool_calls")


@dataclass
class Stored:
    """One stored episode, as far as an export needs it."""

    where: str  # file:line
    outcome: str
    reward: float
    messages: list[dict]
    tools: list[dict] = field(default_factory=list)


@dataclass
class ExportCounts:
    """How many episodes a source held, how many became rows, and why the others did not."""

    episodes: int = 0
    kept: int = 0
    excluded: Counter = field(default_factory=Counter)

    def line(self) -> str:
        """``kept N of M episodes; excluded: <reason>=<count>, ...`` (infrastructure outcomes marked)."""
        parts = [f"{'infra ' if _is_infra(r) else ''}{r}={n}" for r, n in sorted(self.excluded.items())]
        return f"kept {self.kept} of {self.episodes} episodes" + (f"; excluded: {', '.join(parts)}" if parts else "")


def _is_infra(reason: str) -> bool:
    return reason in Outcome._value2member_map_ and not Outcome(reason).trainable


def source_files(source: str | Path) -> list[Path]:
    """The episode files ``source`` names (module docstring); DatasetError when there are none."""
    p = Path(source)
    if p.is_dir():
        files = [p / "trajectories.jsonl"] + sorted((p / "trajectories").glob("step_*.jsonl"))
        files = [f for f in files if f.is_file()] + sorted(p.glob("*.episodes.jsonl"))
        if not files:
            raise DatasetError(
                f"{p}: no episodes here (looked for trajectories.jsonl, trajectories/step_*.jsonl, *.episodes.jsonl)"
            )
        return files
    if not p.is_file():
        raise DatasetError(f"{p}: no such file or directory")
    episodes = output_paths(p)[1]
    if p.suffix == ".jsonl" and not p.name.endswith(".episodes.jsonl") and episodes.is_file():
        return [episodes]  # an eval's chat file: its episodes hold the outcomes and rewards
    return [p]


def read_stored(path: Path) -> Iterator[Stored]:
    """The episodes of one file: trajectories (JSONL or parquet) or an eval's episode lines."""
    if path.suffix == ".parquet":
        for k, t in enumerate(read_parquet(path), 1):
            yield Stored(f"{path}:{k}", Outcome(t.outcome).value, t.reward, t.messages, t.tools)
        return
    try:
        for lineno, row in jsonl_rows(path):
            if not isinstance(row, dict) or "outcome" not in row or "messages" not in row:
                keys = sorted(row)[:8] if isinstance(row, dict) else type(row).__name__
                raise DatasetError(
                    f"{path}:{lineno}: not a trajectory or an eval episode (has {keys}; "
                    "expected 'outcome', 'reward', 'messages')"
                )
            yield Stored(
                f"{path}:{lineno}",
                str(row["outcome"]),
                float(row.get("reward", 0.0)),
                row["messages"],
                row.get("tools") or [],
            )
    except (ValueError, UnicodeDecodeError) as e:
        raise DatasetError(str(e)) from None


def exclusion(ep: Stored, min_reward: float | None) -> str | None:
    """Why ``ep`` is no row (its outcome, or ``reward<R``), or None when it is one."""
    if ep.outcome != Outcome.OK.value:
        return ep.outcome
    if min_reward is not None and ep.reward < min_reward:
        return f"reward<{min_reward:g}"
    return None


def chat_row(ep: Stored) -> dict[str, Any]:
    """The row of one episode (module docstring): its messages, Hermes tool calls structured where
    that is lossless, and its tools."""
    msgs = [{k: m[k] for k in _MESSAGE_KEYS if k in m} for m in ep.messages]
    out = []
    for i, m in enumerate(msgs):
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and not m.get("tool_calls"):
            m = with_tool_calls(m, _answered(msgs, i + 1))
        out.append(m)
    row: dict[str, Any] = {"messages": out}
    if ep.tools:
        row["tools"] = ep.tools
    return row


def _answered(messages: list[dict], start: int) -> list[str]:
    """The ``tool_call_id`` of each tool message from ``start`` to the next assistant message."""
    ids = []
    for m in messages[start:]:
        if m.get("role") == "assistant":
            break
        if m.get("role") == "tool":
            ids.append(m.get("tool_call_id"))
    return ids


def with_tool_calls(message: dict, answered: list[str]) -> dict:
    """``message`` with its Hermes calls as ``tool_calls`` when that is lossless, else as it is."""
    text = message["content"]
    parsed = parse_hermes(text)
    if not parsed.calls or parsed.errors or [c.id for c in parsed.calls] != answered:
        return message
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.calls]
    if render_action(ChatReply(parsed.content, calls), "hermes") != text:
        return message
    return {
        "role": "assistant",
        "content": parsed.content or None,
        "tool_calls": [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for c in calls
        ],
    }


def export_sft(
    source: str | Path, out: str | Path, *, min_reward: float | None = None, dedupe: bool = False
) -> ExportCounts:
    """Write the chat rows of ``source``'s episodes that ended ``ok`` with reward >= ``min_reward``
    (every ``ok`` one when None) to ``out`` (temp file + rename); the counts. ``dedupe``: an identical
    row is written once (the others counted as ``duplicate``)."""
    files = source_files(source)
    out = Path(out)
    counts, seen = ExportCounts(), set()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for path in files:
            for ep in read_stored(path):
                counts.episodes += 1
                why = exclusion(ep, min_reward)
                line = json_text(chat_row(ep)) if why is None else ""
                if why is None:
                    if dedupe:
                        why = "duplicate" if line in seen else None
                        seen.add(line)
                if why is not None:
                    counts.excluded[why] += 1
                    continue
                fh.write(line + "\n")
                counts.kept += 1
    tmp.replace(out)
    return counts
