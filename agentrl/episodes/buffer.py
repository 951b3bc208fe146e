"""The token buffers of a running episode and how they become Trajectories.

Owns :class:`EpisodeBuffer` (the ids, loss mask, logprobs, turn ids, versions, turn records and
messages of one episode as they grow: sampled tokens with mask 1, observation tokens with mask 0),
:func:`write_tokens` (a finished buffer's tokens into its Trajectory) and
:func:`segment_trajectories` (the Trajectories of the segments an episode closed before its last).
Any object with the same attributes serves as a buffer (an :class:`EpisodeStrategy`'s own recorder).
Does not render, sample or score (``agentrl.episodes.manager``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl.trajectory import Trajectory, TurnRecord


class EpisodeBuffer:
    """Mutable token buffers of one running episode."""

    __slots__ = ("ids", "mask", "logprobs", "turn_ids", "versions", "turns", "messages")

    def __init__(self, prompt: list[int], messages: list[dict]) -> None:
        n = len(prompt)
        self.ids, self.mask, self.logprobs = list(prompt), [0] * n, [0.0] * n
        self.turn_ids, self.versions = [-1] * n, [-1] * n
        self.turns: list[TurnRecord] = []
        self.messages = list(messages)

    def add_sampled(self, ids: list[int], logprobs: list[float], versions: list[int], turn: int) -> None:
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.turn_ids.extend([turn] * len(ids))
        self.versions.extend(versions)

    def add_observation(self, ids: list[int], turn: int) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.turn_ids.extend([turn] * len(ids))
        self.versions.extend([-1] * len(ids))


def write_tokens(traj: Trajectory, ep: Any) -> None:
    """Give ``traj`` the buffers of ``ep`` (not copies), and its ``prompt_len`` when it has one."""
    traj.token_ids, traj.loss_mask, traj.logprobs = ep.ids, ep.mask, ep.logprobs
    traj.turn_ids, traj.versions, traj.turns, traj.messages = ep.turn_ids, ep.versions, ep.turns, ep.messages
    traj.prompt_len = getattr(ep, "prompt_len", traj.prompt_len)
    traj.tools = getattr(ep, "tools", traj.tools)  # a strategy's buffer may hold the tools it advertised


def segment_trajectories(traj: Trajectory, segments: list) -> list[Trajectory]:
    """Trajectories of the segments an episode closed before its last one: the episode's outcome
    and reward, their own tokens (``episode_id`` + ``-seg{k}``)."""
    return [
        replace(
            traj,
            episode_id=f"{traj.episode_id}-seg{k}",
            prompt_len=s.prompt_len,
            token_ids=s.ids,
            loss_mask=s.mask,
            logprobs=s.logprobs,
            turn_ids=s.turn_ids,
            versions=s.versions,
            turns=s.turns,
            messages=s.messages,
            tools=getattr(s, "tools", traj.tools),
            info={**traj.info, "segment": k},
        )
        for k, s in enumerate(segments)
    ]
