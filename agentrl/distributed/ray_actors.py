"""The Ray actors of ``distributed: ray``: thin shells around the classes the in-process mode uses.

Owns three plain classes that ``agentrl.distributed.compute`` turns into actors with
``ray.remote(...)``: ``EngineActor`` (one ``LocalEngine``), ``RolloutWorker`` (one
``EpisodeManager`` whose engine the backend chooses: a ``RayEngine`` over engine-actor handles, or
an ``SGLangClient`` straight to SGLang servers) and ``TrainerRank`` (one ``Trainer`` in a
torch.distributed group formed on a rendezvous store rank 0 holds listening). The SGLang engine
actor lives in ``agentrl.distributed.sglang_engines``.
Ray is imported only inside methods that need it (``placement``, ``address``), so the classes
stay plain objects.

Does not: schedule or place actors, fan calls out to ranks (``adapters``), or implement any of
the engine/episode/trainer logic: every method forwards to the wrapped object.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.engine.base import Engine, Generation, SamplingParams
from agentrl.episodes.manager import EpisodeManager
from agentrl.episodes.tokenizer import prepare
from agentrl.weights.drain import DrainEngine, with_partial_rollouts

if TYPE_CHECKING:
    from agentrl.trainer.protocol import TrainerProtocol


class _Placed:
    def placement(self) -> dict:
        """Where Ray put this actor: placement group id, bundle-scoped resources, pid (diagnostics)."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "placement_group": ctx.get_placement_group_id(),
            "resources": ctx.get_assigned_resources(),
            "pid": os.getpid(),
            "node": ctx.get_node_id(),
        }


class EngineActor(_Placed):
    """An async actor holding a LocalEngine: concurrent ``generate`` calls from rollout workers
    meet on the actor's event loop and are batched by the engine as in-process calls are."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str,
        dtype: str,
        max_batch_size: int,
        max_context: int,
        prefix_cache_tokens: int = 32768,
    ) -> None:
        import torch

        from agentrl.engine.local.engine import LocalEngine  # lazy: pulls in torch

        self.engine = LocalEngine.from_pretrained(
            model_path,
            device=device,
            dtype=getattr(torch, dtype),
            max_batch_size=max_batch_size,
            max_context=max_context,
            prefix_cache_tokens=prefix_cache_tokens,
        )

    async def start(self) -> None:
        await self.engine.start()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, session: str | None = None
    ) -> Generation:
        return await self.engine.generate(prompt_ids, params, session=session)

    async def update_weights(self, state_dict: Mapping[str, Any], version: int) -> int:
        await self.engine.update_weights(state_dict, version)
        return self.engine.policy_version

    async def policy_version(self) -> int:
        return self.engine.policy_version


class RolloutWorker(_Placed):
    """An async actor running episodes with its own EpisodeManager (env, tokenizer, turn loop) and
    the engine ``make_engine()`` builds here (a picklable factory: ``functools.partial(RayEngine,
    actors)`` or ``functools.partial(SGLangClient, urls)``). ``chat`` is (the text of
    ``model.chat_template`` or None, its config value, ``model.tool_prompt``): the tokenizer is set up
    as the driver's (``agentrl.episodes.tokenizer.prepare``)."""

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        model_path: str,
        rollout_cfg,
        env_spec,
        env_kwargs: dict,
        chat: tuple = (None, None, "auto"),
    ) -> None:
        from transformers import AutoTokenizer

        from agentrl.envs import registry  # lazy: pulls in gymnasium

        if env_spec.source == "register":  # registered by the driver's code, not by a package
            registry.register(
                env_spec.id, env_spec.entry_point, max_turns=env_spec.max_turns, override=True, **env_spec.kwargs
            )
        env_id = env_spec.id
        registry.make(env_id, **env_kwargs).close()  # fail at startup, naming the env, not per episode
        # partial_rollouts=false: the driver drains every worker around a weight push (hold/release)
        self.engine = with_partial_rollouts(make_engine(), rollout_cfg.partial_rollouts)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        text, name, tool_prompt = chat  # as the driver set its own up (agentrl.episodes.tokenizer)
        prepare(tokenizer, text, tool_prompt, name=name, model=model_path)
        self.manager = EpisodeManager(
            self.engine,
            lambda: registry.make(env_id, **env_kwargs),
            tokenizer,
            rollout_cfg,
            env_id=env_id,
        )

    async def run_episode(self, spec):
        return await self.manager.run_episode(spec)

    async def run_episodes(self, specs: list) -> list:
        return list(await asyncio.gather(*(self.manager.run_episode(s) for s in specs)))

    async def ping(self) -> bool:
        return True

    def _drain(self) -> DrainEngine:
        if not isinstance(self.engine, DrainEngine):
            raise RuntimeError("hold/release: this worker runs with partial_rollouts=true (no drain gate)")
        return self.engine

    async def hold_generation(self) -> float:
        """partial_rollouts=false: hold new generations, wait for those in flight (seconds waited)."""
        return await self._drain().hold()

    async def release_generation(self) -> None:
        self._drain().release()

    async def engine_counts(self) -> dict[str, dict[str, int]]:
        """Per server URL, this worker's request counters (SGLang engines; {} for others)."""
        router = getattr(self.engine, "router", None)
        return {} if router is None else {b.url: dict(b.counts) for b in router.backends}


class TrainerRank(_Placed):
    """One FSDP rank: ``address()`` on rank 0 names the rendezvous, then ``setup`` on every rank
    (concurrently: it blocks until all have joined) builds the Trainer in that group."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self._trainer: TrainerProtocol | None = None  # setup()
        self.store = None  # rank 0: the rendezvous store, listening since address()

    def address(self) -> tuple[str, int]:
        import ray

        from agentrl.trainer.dist import listening_store  # lazy: pulls in torch

        self.store = listening_store(self.world)
        return ray.util.get_node_ip_address(), self.store.port

    def setup(self, model_path: str, cfg, critic: bool, master_addr: str, master_port: int) -> int:
        # LOCAL_RANK 0: Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK="0",
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        from agentrl.trainer import Trainer  # lazy: pulls in torch
        from agentrl.trainer.dist import join_store  # lazy: pulls in torch

        store = self.store or join_store(master_addr, master_port, self.world, cfg.dist_timeout_s)
        trainer = Trainer(model_path, cfg, critic=critic, store=store)
        self._trainer = trainer
        return trainer.world

    @property
    def trainer(self) -> TrainerProtocol:
        if self._trainer is None:
            raise RuntimeError(f"trainer rank {self.rank}: setup() has not run")
        return self._trainer

    def train_step(self, samples: list) -> tuple[dict, int]:
        metrics = self.trainer.train_step(samples)
        return metrics, self.trainer.version

    def values(self, samples: list) -> list:
        return self.trainer.values(samples)

    def logprobs(self, samples: list) -> list:
        return self.trainer.logprobs(samples)

    def ref_logprobs(self, samples: list) -> list:
        return self.trainer.ref_logprobs(samples)

    def full_state_dict(self) -> dict:
        return self.trainer.full_state_dict()

    def save(self, path: str, extra: dict | None, files: dict | None = None) -> None:
        # files (checkpoint text files, e.g. the runner's rollouts.jsonl) only when given
        self.trainer.save(path, extra=extra, **({"files": files} if files is not None else {}))

    def load(self, path: str) -> tuple[dict, int]:
        extra = self.trainer.load(path)
        return extra, self.trainer.version

    def close(self) -> None:
        if self._trainer is not None:
            self._trainer.close()
