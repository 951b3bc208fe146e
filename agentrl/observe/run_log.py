"""What a training run keeps about its rollouts beyond scalar metrics.

Owns: the per-step rollout statistics the report and the monitors read (tokens per episode, share
of distinct completions within groups, outcome counts, turns that span policy versions) and saving
the trained trajectories of each step, token-exact and with the per-token advantages they were trained with
(``info["advantages"]``), to ``RUN/trajectories/step_NNNNNN.jsonl`` (temp file + rename: a reader never
sees half a file). Does not compute advantages (``agentrl.batches.samples``) or render anything
(``agentrl.observe.report``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from agentrl.trajectory import Trajectory, write_jsonl


def rollout_extra(groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
    """``tokens_per_episode`` (sampled tokens), ``distinct_frac`` (distinct sampled-token sequences /
    samples, averaged over groups of 2+), ``outcome/<name>`` counts, and ``mixed_version_turns``
    (fraction of assistant turns with sampled tokens whose tokens carry more than one policy version:
    partial rollouts; always 0 with ``rollout.partial_rollouts=false``)."""
    trajs = [t for g in groups for t in g]
    out: dict[str, float] = {}
    if trajs:
        out["tokens_per_episode"] = sum(t.num_sampled for t in trajs) / len(trajs)
    fracs = []
    for g in groups:
        if len(g) > 1:
            seqs = {tuple(tok for tok, m in zip(t.token_ids, t.loss_mask) if m) for t in g}
            fracs.append(len(seqs) / len(g))
    if fracs:
        out["distinct_frac"] = sum(fracs) / len(fracs)
    for name, n in Counter(str(getattr(t.outcome, "value", t.outcome)) for t in trajs).items():
        out[f"outcome/{name}"] = float(n)
    turns = [versions for t in trajs for versions in turn_versions(t)]
    if turns:
        out["mixed_version_turns"] = sum(len(v) > 1 for v in turns) / len(turns)
    return out


def turn_versions(traj: Trajectory) -> list[set[int]]:
    """The set of policy versions that sampled each assistant turn of ``traj`` (turns without sampled
    tokens are left out). A set of two or more: a weight update landed mid-turn (a partial rollout)."""
    n = min(len(traj.versions), len(traj.loss_mask))
    out = []
    for turn in traj.turns:
        # a metric never fails a step: tokens a malformed record points past are not counted
        span = range(max(turn.start, 0), min(turn.start + turn.n_sampled, n))
        versions = {traj.versions[i] for i in span if traj.loss_mask[i]}
        if versions:
            out.append(versions)
    return out


class TrajectoryLog:
    """Writes each step's trajectories. ``per_step``: how many to keep per step (-1 all, 0 none);
    trained ones first (they carry advantages), then the excluded ones (infra failures)."""

    def __init__(self, run_dir: str | Path, per_step: int) -> None:
        self.dir = Path(run_dir) / "trajectories"
        self.per_step = per_step

    def write(
        self,
        step: int,
        groups: Sequence[Sequence[Trajectory]],
        trained: Sequence[Trajectory],
        advantages: Sequence[Sequence[float]],
    ) -> Path | None:
        """``trained[i]`` was trained with per-token ``advantages[i]``; the rest of ``groups`` was not."""
        if self.per_step == 0:
            return None
        if len(trained) != len(advantages):
            raise ValueError(f"{len(trained)} trained trajectories but {len(advantages)} advantage rows")
        for t, adv in zip(trained, advantages):
            if len(adv) != len(t.token_ids):
                raise ValueError(f"{t.episode_id}: {len(adv)} advantages for {len(t.token_ids)} tokens")
            t.info["advantages"] = [float(a) for a in adv]
        ids = {id(t) for t in trained}
        rest = [t for g in groups for t in g if id(t) not in ids]
        keep = list(trained) + rest
        if self.per_step > 0:
            keep = keep[: self.per_step]
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step_{step:06d}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        write_jsonl(tmp, keep)
        tmp.replace(path)
        return path
