"""Driver-side faces of the Ray actors: the same interfaces the in-process run loop already uses.

Owns ``RayEngine`` (an ``Engine`` over engine actors: sticky routing per session, one object-store
copy of new weights for all engines, Ray failures mapped to EngineError), ``RayTrainer`` (the
Trainer's methods fanned out to every rank with the same arguments, rank 0's answer returned,
failing fast when one rank fails) and ``RayEpisodes`` (an EpisodeManager face: ``run_episode`` /
``collect`` / ``metrics`` / ``cancel``, episodes of one group sent to one rollout worker; a dead
worker ends its episodes as ``engine_error`` trajectories, never an exception to the batch).

Does not create actors or placement groups (``compute``), or run episodes / training itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.episodes.source import EpisodeSource
from agentrl.episodes.spec import EpisodeSpec
from agentrl.errors import EngineError
from agentrl.observe.metrics import RolloutMetrics
from agentrl.trainer.protocol import TrainerProtocol
from agentrl.trajectory import Outcome, Trajectory

if TYPE_CHECKING:
    import threading
    from pathlib import Path

    from agentrl.trainer.packing import TrainSample


def _shard(key: str, n: int) -> int:
    """Stable across processes (unlike hash()) and well mixed (crc32's low bits are not: ids that
    differ in one digit all landed on one worker)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") % n


def _pick(key: str | None, n: int, counter: list[int]) -> int:
    if key is not None:
        return _shard(key, n)
    counter[0] += 1
    return counter[0] % n


class RayEngine(Engine):
    """An Engine whose generations run in ``EngineActor`` actors (usable in the driver and inside
    rollout workers: actor handles travel)."""

    def __init__(self, actors: list, *, max_context: int | None = None) -> None:
        if not actors:
            raise ValueError("RayEngine needs at least one engine actor")
        self.actors = list(actors)
        self._max_context = max_context
        self._version = 0
        self._rr = [0]

    @property
    def policy_version(self) -> int:  # type: ignore[override]
        return self._version

    @property
    def max_context(self) -> int | None:
        return self._max_context

    async def _call(self, i: int, method: str, *args: Any, **kw: Any) -> Any:
        import ray
        import ray.exceptions  # a submodule: named for the type checker (ray imports it itself)

        try:
            return await getattr(self.actors[i], method).remote(*args, **kw)
        except EngineError:
            raise  # raised by the engine inside the actor (Ray re-raises it as its own class)
        except ray.exceptions.RayError as e:
            raise EngineError(f"engine actor {i}: {type(e).__name__}: {str(e)[:500]}") from e

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, session: str | None = None
    ) -> Generation:
        i = _pick(session, len(self.actors), self._rr)
        return await self._call(i, "generate", list(prompt_ids), params, session)

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        import ray

        ref = ray.put(dict(state_dict))  # one copy in the object store, read by every engine
        await asyncio.gather(*(self._call(i, "update_weights", ref, version) for i in range(len(self.actors))))
        self._version = version

    async def start(self) -> None:
        await asyncio.gather(*(self._call(i, "start") for i in range(len(self.actors))))

    async def close(self) -> None:
        await asyncio.gather(*(self._call(i, "close") for i in range(len(self.actors))), return_exceptions=True)


def get_all(refs: list, timeout_s: float | None, what: str) -> list[Any]:
    """``ray.get(refs)``, but the first failure raises at once: the other calls may be stuck in a
    collective (or a rendezvous) that the failed one will never join."""
    import ray

    pending = list(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not done:
            raise TimeoutError(f"{what}: not finished in {timeout_s}s")
        ray.get(done[0])  # raises that call's error
    return ray.get(refs)


class RayTrainer(TrainerProtocol):
    """The Trainer interface the run loop uses, over ``TrainerRank`` actors of one group."""

    def __init__(self, ranks: list, timeout_s: float | None = None) -> None:
        self.ranks = list(ranks)
        self.world = len(ranks)
        self.version = 0
        self.timeout_s = timeout_s
        self._closed = False

    def _all(self, method: str, *args: Any) -> list[Any]:
        return get_all(
            [getattr(r, method).remote(*args) for r in self.ranks], self.timeout_s, f"trainer ranks: {method}"
        )

    def train_step(self, samples: list[TrainSample], interrupt: threading.Event | None = None) -> dict[str, float]:
        """The ranks' step. ``interrupt`` is not honoured: the ranks would have to agree on where to
        stop, so a stop request under Ray waits for the step to end."""
        import ray

        metrics, self.version = self._all("train_step", ray.put(samples))[0]
        return metrics

    def values(self, samples: list[TrainSample]) -> list[list[float]]:
        import ray

        return self._all("values", ray.put(samples))[0]

    def logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        import ray

        return self._all("logprobs", ray.put(samples))[0]

    def ref_logprobs(self, samples: list[TrainSample]) -> list[list[float]]:
        import ray

        return self._all("ref_logprobs", ray.put(samples))[0]

    def full_state_dict(self) -> dict[str, Any]:
        """Rank 0's gathered weights (every rank takes part in the gather)."""
        return self._all("full_state_dict")[0]

    def save(self, path: str | Path, *, extra: dict | None = None, files: dict[str, str] | None = None) -> None:
        self._all("save", str(path), extra, files)

    def load(self, path: str | Path) -> dict:
        extra, self.version = self._all("load", str(path))[0]
        return extra

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        import ray

        try:
            ray.get([r.close.remote() for r in self.ranks], timeout=60)
        except Exception:
            pass  # a dead or stuck rank: RayCompute kills the actors next


class RayEpisodes(EpisodeSource):
    """An EpisodeManager face over ``RolloutWorker`` actors; metrics are kept here, in the driver.
    The workers run the built-in turn loop (``agent.kind: builtin``), which never splits an episode."""

    def __init__(self, workers: list, env_id: str = "") -> None:
        if not workers:
            raise ValueError("RayEpisodes needs at least one rollout worker")
        self.workers = list(workers)
        self.env_id = env_id
        self.metrics = RolloutMetrics()
        self._refs: set = set()

    async def run_episode(self, spec: EpisodeSpec) -> Trajectory:
        """Run ``spec`` on the worker of its group; never raises except the caller's cancellation."""
        import ray

        i = _shard(spec.group_id, len(self.workers))
        ref = self.workers[i].run_episode.remote(spec)
        self._refs.add(ref)
        try:
            traj = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # ends the episode in the worker too
            raise
        except Exception as e:  # the worker died or could not deserialize: infra, not model, failure
            traj = Trajectory(
                episode_id=f"{spec.group_id}-{spec.sample_index}",
                group_id=spec.group_id,
                env_id=self.env_id,
                prompt_len=0,
                sample_index=spec.sample_index,
            )
            traj.outcome, traj.reward = Outcome.ENGINE_ERROR, 0.0
            traj.outcome_detail = f"rollout worker {i}: {type(e).__name__}: {str(e)[:500]}"
        finally:
            self._refs.discard(ref)
        self.metrics.add(traj)
        return traj

    async def run_segments(self, spec: EpisodeSpec) -> list[Trajectory]:
        """``run_episode`` as a list: the workers' built-in loop makes one trajectory per episode."""
        return [await self.run_episode(spec)]

    async def collect(self, specs: Iterable[EpisodeSpec]) -> list[Trajectory]:
        return list(await asyncio.gather(*(self.run_episode(s) for s in specs)))

    def gates(self) -> list[WorkerGate]:
        """One drain gate per worker (``agentrl.weights.drain.drained_together``; partial_rollouts=false)."""
        return [WorkerGate(w, i) for i, w in enumerate(self.workers)]

    def cancel(self) -> None:
        import ray

        for ref in list(self._refs):
            ray.cancel(ref)


class WorkerGate:
    """A rollout worker's drain gate seen from the driver: ``hold``/``release`` actor calls. A hold
    cancelled here may still complete in the worker: it is then released, so no worker stays held."""

    def __init__(self, worker: Any, index: int) -> None:
        self.worker, self.index = worker, index

    async def hold(self) -> float:
        import ray
        import ray.exceptions  # a submodule: named for the type checker (ray imports it itself)

        ref = self.worker.hold_generation.remote()
        try:
            return await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            asyncio.ensure_future(self._release_if_held(ref))
            raise
        except ray.exceptions.RayError as e:
            raise EngineError(f"rollout worker {self.index}: drain failed: {type(e).__name__}: {str(e)[:300]}") from e

    async def _release_if_held(self, ref: Any) -> None:
        try:
            await ref
        except BaseException:
            return  # cancelled or failed in the worker: its gate reopened there
        await self.release()

    async def release(self) -> None:
        await self.worker.release_generation.remote()
