"""Noticing a lost Ray node or actor mid-run, and restarting the run from its checkpoint.

Owns :func:`is_node_loss` (is this exception, or one it was raised from, a dead actor / dead node /
lost object?), :func:`lost_nodes` (which of a run's actors sit on nodes Ray reports dead: pure over
``ray.nodes()`` rows), :func:`watch` (the driver's heartbeat: every ``interval_s`` it checks the
actors' nodes and pings the actors, and raises :class:`~agentrl.errors.NodeLostError` naming what
died; a ping that times out is a busy actor, not a dead one) and :func:`supervise` (run an attempt;
after a node loss start the next one, at most ``restarts`` times, recording each recovery).

A loss shows up three ways: a call to a dead trainer rank or engine actor raises (``RayActorError``,
mapped by the adapters to EngineError with the Ray error as its cause), the heartbeat finds a dead
node or actor (the only way to notice a dead rollout worker: its episodes end ``engine_error``
without raising), or an object on the lost node cannot be fetched (``ObjectLostError``). Time to
notice: at most ``ray.heartbeat_s`` after Ray itself marks the node dead (its GCS health check, about
15 s by default on a real cluster; at once when a raylet exits).

Does not restart actors itself or resume a run (``agentrl.jobs.run`` builds a new backend and resumes
from the newest checkpoint with its exactly-once ledger), nor place actors (``cluster``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentrl.errors import NodeLostError

T = TypeVar("T")

#: Ray exception class names that mean an actor, its node or an object on it is gone
LOSS_ERRORS = (
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "NodeDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "ObjectFetchTimedOutError",
    "ReferenceCountingAssertionError",
    "LocalRayletDiedError",
    "WorkerCrashedError",
    "RaySystemError",
)


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """``exc``, its causes/contexts and the members of exception groups (each once)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]


def is_node_loss(exc: BaseException) -> bool:
    """True if ``exc`` or an exception in its chain is a NodeLostError or one of Ray's dead-actor /
    dead-node / lost-object errors (by class, including subclasses Ray creates for user errors)."""
    for e in _chain(exc):
        if isinstance(e, NodeLostError):
            return True
        if any(c.__name__ in LOSS_ERRORS and c.__module__.startswith("ray.") for c in type(e).__mro__):
            return True
    return False


def lost_nodes(where: Mapping[str, str], nodes: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """``where``: actor name -> node id; ``nodes``: ``ray.nodes()`` rows (``NodeID``, ``Alive``).
    Returns dead or unknown node id -> the names of the actors on it (empty: all alive)."""
    alive = {n["NodeID"] for n in nodes if n.get("Alive")}
    out: dict[str, list[str]] = {}
    for name, node in where.items():
        if node not in alive:
            out.setdefault(node, []).append(name)
    return out


def describe_loss(lost: Mapping[str, list[str]]) -> str:
    return "; ".join(f"node {node[:12]} lost with {', '.join(names)}" for node, names in sorted(lost.items()))


async def watch(
    actors: Mapping[str, Any], where: Mapping[str, str], *, interval_s: float, probe_timeout_s: float | None = None
) -> None:
    """Return never; raise NodeLostError when a node in ``where`` (actor name -> node id) is dead
    or an actor in ``actors`` (name -> handle with a ``placement`` method) has died."""
    import ray

    probe = probe_timeout_s if probe_timeout_s is not None else max(interval_s, 1.0)
    while True:
        await asyncio.sleep(interval_s)
        lost = lost_nodes(where, await asyncio.to_thread(ray.nodes))
        if lost:
            raise NodeLostError(f"ray: {describe_loss(lost)}")
        for name, actor in actors.items():
            try:
                await asyncio.wait_for(asyncio.wrap_future(actor.placement.remote().future()), probe)
            except TimeoutError:
                continue  # busy (a sync actor inside a long call): not known dead
            except Exception as e:
                if is_node_loss(e):
                    raise NodeLostError(
                        f"ray: actor {name} (node {where.get(name, '?')[:12]}) died: {type(e).__name__}: {str(e)[:300]}"
                    ) from e
                raise


@dataclass
class Recovery:
    """One restart: what was lost, when it was noticed (unix seconds) and the attempt that followed."""

    attempt: int
    error: str
    noticed_at: float
    resumed_step: int | None = None
    recovered_at: float | None = None  # the first step after the restart finished

    def as_dict(self) -> dict[str, Any]:
        d = {
            "attempt": self.attempt,
            "error": self.error,
            "noticed_at": self.noticed_at,
            "resumed_step": self.resumed_step,
            "recovered_at": self.recovered_at,
        }
        if self.recovered_at is not None:
            d["recover_s"] = self.recovered_at - self.noticed_at
        return d


@dataclass
class Supervisor:
    """Runs ``attempt(n)`` (n = 0, 1, ...) until one returns; an attempt that fails with a node loss
    (:func:`is_node_loss`) is followed by the next, at most ``restarts`` times; any other error, or
    one loss too many, propagates. ``recoveries`` records each restart."""

    restarts: int
    recoveries: list[Recovery] = field(default_factory=list)
    note: Callable[[str], None] = print

    async def run(self, attempt: Callable[[int], Awaitable[T]]) -> T:
        n = 0
        while True:
            try:
                return await attempt(n)
            except Exception as e:
                if n >= self.restarts or not is_node_loss(e):
                    raise
                n += 1
                err = f"{type(e).__name__}: {str(e)[:300]}"
                self.recoveries.append(Recovery(n, err, time.time()))
                self.note(f"node or actor lost ({err}); restart {n}/{self.restarts} from the newest checkpoint")

    def stepped(self, step: int) -> None:
        """Call after each finished step: closes the open recovery (resumed at ``step - 1``, the
        checkpoint's step; its time to recover)."""
        r = self.recoveries[-1] if self.recoveries else None
        if r is not None and r.recovered_at is None:
            r.recovered_at, r.resumed_step = time.time(), step - 1
            self.note(
                f"recovered: resumed at step {step - 1}, step {step} done "
                f"{r.recovered_at - r.noticed_at:.1f}s after the loss was noticed"
            )
