"""What episodes to run: :class:`EpisodeSpec` and :func:`make_specs`.

Owns the identity of one episode (group, sample index, task seed, sampling seed, reset options) and
the layout of a batch of them (tasks x group samples, a group's samples adjacent). Does not run
episodes (``agentrl.episodes.manager``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run. All samples of a group share ``task_seed`` (hence the task)."""

    group_id: str
    sample_index: int
    task_seed: int
    sampling_seed: int | None = None
    options: dict | None = None


def make_specs(num_prompts: int, group_size: int, seed: int = 0, start: int = 0, attempt: int = 0) -> list[EpisodeSpec]:
    """Specs for ``num_prompts`` tasks x ``group_size`` samples; a group's samples are adjacent so
    they run together (prefix caching in engines that have it). ``attempt`` (how many times the
    staleness bound dropped this prompt's group) keeps the tasks and changes the sampling seeds: a
    rerun is a new attempt, with new samples."""
    specs = []
    for i in range(start, start + num_prompts):
        task_seed = (seed * 1_000_003 + i) % (2**31)
        for g in range(group_size):
            specs.append(
                EpisodeSpec(f"s{seed}-p{i}", g, task_seed, (task_seed * 131 + g + 999_983 * attempt) % (2**31))
            )
    return specs
