"""Joining or starting Ray, and the placement groups the actors are scheduled on.

Owns: ``RayCluster`` (``ray.init`` of a local instance or of a cluster named by ``ray.address`` /
``$RAY_ADDRESS``, and ``ray.shutdown`` only of an instance it started or joined itself), ``plan``
(the bundles of a colocated or split layout and the bundle of every actor), and placing those
placement groups with a deadline whose error names the bundles and the cluster's resources.
Does not create actors (``agentrl.distributed.compute`` does) or know what runs in them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.distributed.config import RayConfig
from agentrl.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    """Where one actor goes: bundle ``bundle`` of placement group ``group``, asking for ``resources``."""

    group: int
    bundle: int
    cpus: float
    gpus: float = 0.0


@dataclass
class Layout:
    """Bundles per placement group and the slot of each actor. ``workers[k]`` serves engine
    ``k // workers_per_engine``."""

    bundles: list[list[dict[str, float]]] = field(default_factory=list)
    trainer: list[Slot] = field(default_factory=list)
    engines: list[Slot] = field(default_factory=list)
    workers: list[Slot] = field(default_factory=list)


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": round(cpus, 4), **({"GPU": round(gpus, 4)} if gpus > 0 else {})}


def plan(rc: RayConfig) -> Layout:
    """colocate: one group; bundle i holds trainer rank i, engine i and engine i's workers.
    split: group 0 holds the trainer ranks, group 1 the engines with their workers."""
    out = Layout()
    ranks, engines, wpe = rc.trainer_ranks, rc.num_engines, rc.workers_per_engine
    side_cpus = rc.engine_cpus + wpe * rc.worker_cpus
    if rc.placement == "colocate":
        n = max(ranks, engines)
        out.bundles = [
            [
                _bundle(
                    rc.trainer_cpus * (i < ranks) + side_cpus * (i < engines),
                    rc.trainer_gpus * (i < ranks) + rc.engine_gpus * (i < engines),
                )
                for i in range(n)
            ]
        ]
        rollout_group = 0
        out.trainer = [Slot(0, i, rc.trainer_cpus, rc.trainer_gpus) for i in range(ranks)]
    else:
        out.bundles = [
            [_bundle(rc.trainer_cpus, rc.trainer_gpus)] * ranks,
            [_bundle(side_cpus, rc.engine_gpus)] * engines,
        ]
        rollout_group = 1
        out.trainer = [Slot(0, i, rc.trainer_cpus, rc.trainer_gpus) for i in range(ranks)]
    out.engines = [Slot(rollout_group, j, rc.engine_cpus, rc.engine_gpus) for j in range(engines)]
    out.workers = [Slot(rollout_group, k // wpe, rc.worker_cpus) for k in range(engines * wpe)]
    return out


class RayCluster:
    """A connection to Ray plus the placement groups this run created. ``close()`` removes them
    and shuts down the Ray connection if ``connect()`` made it."""

    def __init__(self, rc: RayConfig) -> None:
        rc.check()
        self.rc = rc
        self.groups: list[Any] = []
        self.owns_connection = False
        self.address: str | None = rc.address or os.environ.get("RAY_ADDRESS") or None
        self.connect_s = 0.0

    def connect(self) -> None:
        import ray

        t0 = time.perf_counter()
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address)
            else:
                # "local": a new instance even where a `ray start` cluster is recorded in /tmp/ray
                ray.init(address="local", num_cpus=self.rc.num_cpus, include_dashboard=False)
            self.owns_connection = True
        self.connect_s = time.perf_counter() - t0

    def place(self, layout: Layout) -> list[Any]:
        """Create one placement group per entry of ``layout.bundles`` and wait until all are placed."""
        import ray
        import ray.exceptions  # a submodule: named for the type checker (ray imports it itself)
        from ray.util.placement_group import placement_group

        for i, bundles in enumerate(layout.bundles):
            self.groups.append(
                placement_group(bundles, strategy=self.rc.pg_strategy, name=f"agentrl-{os.getpid()}-{i}")
            )
        try:
            ray.get([g.ready() for g in self.groups], timeout=self.rc.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"ray placement: bundles {layout.bundles} ({self.rc.placement}) could not be placed "
                f"({self.rc.pg_strategy}) in {self.rc.startup_timeout_s}s; the cluster has "
                f"{ray.available_resources()} available - lower ray.*_cpus / *_gpus or the actor counts"
            ) from None
        return self.groups

    def strategy(self, slot: Slot):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.groups[slot.group], placement_group_bundle_index=slot.bundle
        )

    def close(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        from ray.util.placement_group import remove_placement_group

        for g in self.groups:
            try:
                remove_placement_group(g)
            except Exception:
                pass  # already gone with a dead cluster
        self.groups = []
        if self.owns_connection:
            ray.shutdown()
            self.owns_connection = False
