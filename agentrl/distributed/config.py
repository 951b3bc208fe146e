"""The ``ray:`` section of the run config: where Ray runs and how actors are laid out on it.

Owns the RayConfig dataclass (every field documented with ``doc()``) and its cross-field check.
Does not start Ray or create actors (``agentrl.distributed.cluster`` / ``compute`` do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl.common.fields import doc
from agentrl.errors import ConfigError


@dataclass
class RayConfig:
    address: str | None = doc(
        None, "Ray cluster to join ('auto' or ray://host:port); null: $RAY_ADDRESS if set, else start a local instance."
    )
    num_cpus: int | None = doc(None, "A locally started instance: logical CPUs it offers (null: all cores).", min=1)
    placement: Literal["colocate", "split"] = doc(
        "colocate",
        "colocate: trainer rank i, engine i and its rollout workers share bundle i of one placement "
        "group; split: trainer ranks and the rollout side (engines + workers) get separate placement groups.",
    )
    trainer_ranks: int = doc(1, "FSDP trainer ranks (Ray actors forming one torch.distributed group).", min=1)
    num_engines: int = doc(
        1,
        "Rollout engine actors (each holds a LocalEngine, or launches one SGLang server when "
        "engine.kind=sglang); requests of one episode stick to one.",
        min=1,
    )
    workers_per_engine: int = doc(1, "Rollout-worker actors (each runs an EpisodeManager) per engine.", min=1)
    trainer_cpus: float = doc(0.5, "Logical CPUs each trainer rank asks for.", min=0.01)
    engine_cpus: float = doc(0.5, "Logical CPUs each engine actor asks for.", min=0.01)
    worker_cpus: float = doc(0.25, "Logical CPUs each rollout-worker actor asks for.", min=0.01)
    trainer_gpus: float = doc(0.0, "GPUs each trainer rank asks for (fractions share a GPU when colocated).", min=0.0)
    engine_gpus: float = doc(0.0, "GPUs each engine actor asks for.", min=0.0)
    server_host: str | None = doc(
        None,
        "engine.kind=sglang: the address engine actors' SGLang servers listen on; null: 127.0.0.1 on a local "
        "Ray instance, the node's IP when joining a cluster (the driver and workers must reach it).",
    )
    startup_timeout_s: float = doc(
        300.0, "Deadline for the placement groups to be placed and the actors to be built.", min=1.0
    )
    pg_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = doc(
        "PACK",
        "Ray placement-group strategy of every group: PACK (bundles on as few nodes as fit), SPREAD (on "
        "different nodes where possible), STRICT_PACK (one node or fail), STRICT_SPREAD (one node per bundle or fail).",
    )
    shared_filesystem: bool = doc(
        False,
        "Every node sees output_dir and engine.weights_dir at the same path (NFS, Lustre...). Without it a "
        "cluster run cannot use engine.weight_sync=disk (use object_store); checkpoints still go to output_dir.",
    )
    restart_on_node_loss: int = doc(
        0,
        "Restarts allowed after a Ray node or actor is lost mid-run: the run stops its actors, places them again "
        "on the nodes left and resumes from its newest checkpoint (exactly once); 0: the run fails.",
        min=0,
    )
    heartbeat_s: float = doc(
        5.0,
        "Seconds between the driver's liveness checks of the run's actors and their nodes (a lost one ends the "
        "attempt: see restart_on_node_loss).",
        min=0.1,
    )

    def check(self) -> None:
        if self.address is not None and not self.address.strip():
            raise ConfigError(f"ray.address: {self.address!r} is empty; use null for a local instance")
        if self.server_host is not None and not self.server_host.strip():
            raise ConfigError(f"ray.server_host: {self.server_host!r} is empty; use null for the default")
