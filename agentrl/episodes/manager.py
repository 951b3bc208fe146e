"""The async episode manager: runs many multi-turn episodes at once and streams Trajectories.

Owns: the turn loop (render -> engine.generate -> env.step -> observation delta), token-exact
trajectory assembly (with the state key each turn starts from: ``state_key_of``, and the named
reward components the env reports: ``add_reward_components``), groups of G
samples per task, max turns, per-turn and per-episode deadlines,
the context budget (checked before every request), the observation length cap, cancellation, and
mapping every failure to a typed Outcome so that one failing episode never breaks the others, and
holding new episodes back while a sandbox is saturated (``agentrl.sandbox.slots.admission``).
The token buffers are ``agentrl.episodes.buffer``'s; what to run, ``agentrl.episodes.spec``'s.
Does not batch model calls (engines do), parse tool calls or run tools (envs do), or train.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import numbers
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from agentrl.engine.base import Engine, SamplingParams
from agentrl.episodes.buffer import EpisodeBuffer, segment_trajectories, write_tokens
from agentrl.episodes.chat import ChatRenderer
from agentrl.episodes.config import RolloutConfig
from agentrl.episodes.source import EpisodeSource
from agentrl.episodes.spec import EpisodeSpec, make_specs
from agentrl.episodes.summary import RolloutMetrics
from agentrl.errors import EngineError, EnvError, EpisodeError, ToolTimeoutError
from agentrl.sandbox.slots import admission
from agentrl.trajectory import Outcome, Trajectory, TurnRecord

if TYPE_CHECKING:  # typing only: importing transformers is slow
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "EpisodeManager",
    "EpisodeStrategy",
    "EpisodeSpec",
    "add_reward_components",
    "make_specs",
    "state_key_of",
    "stop_strings",
]

_TRUNC_MARK = "\n[truncated {n} chars]"
_log = logging.getLogger(__name__)
_warned_no_state_key: set[str] = set()


def stop_strings(configured: Any, env: Any) -> tuple[str, ...]:
    """The run's ``rollout.stop`` strings, then the env's own ``stop_strings`` attribute (e.g. the
    closing tags of a peer env's actions), without repeats."""
    own = getattr(env, "stop_strings", None) or ()
    if isinstance(own, str):
        raise EnvError(f"{type(env).__name__}.stop_strings must be a sequence of strings, got the string {own!r}")
    return tuple(dict.fromkeys([*(configured or ()), *own]))


def add_reward_components(traj: Trajectory, info: Any) -> None:
    """Add a step's ``info["reward_components"]`` (``{name: number}``: the named parts of that step's
    reward, e.g. correctness and format) to ``traj.info["reward_components"]``, summed over the
    episode's steps as its turn rewards are (``algo.reward_normalization=gdpo`` normalises each on its
    own). A step without them adds nothing; a malformed one is the env's error (EnvError)."""
    comps = info.get("reward_components") if isinstance(info, Mapping) else None
    if comps is None:
        return
    if not isinstance(comps, Mapping):
        raise EnvError(f"info['reward_components'] must map names to numbers, got {type(comps).__name__}")
    total = traj.info.setdefault("reward_components", {})
    for name, v in comps.items():
        if not isinstance(name, str) or not name:
            raise EnvError(f"info['reward_components']: a component name must be a non-empty string, got {name!r}")
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise EnvError(f"info['reward_components'][{name!r}]: {v!r} is not a finite number")
        total[name] = total.get(name, 0.0) + float(v)


def state_key_of(env: Any, obs: str) -> str:
    """The anchor state a turn starts from: ``env.state_key()`` if the env has one, else ``"obs:"`` +
    a hash of the observation text (said once per env class in the log)."""
    fn = getattr(getattr(env, "unwrapped", env), "state_key", None)
    if callable(fn):
        return str(fn())
    name = type(getattr(env, "unwrapped", env)).__name__
    if name not in _warned_no_state_key:
        _warned_no_state_key.add(name)
        _log.info("%s has no state_key(): turns' anchor states (GiGPO) are hashes of the observation text", name)
    return "obs:" + hashlib.blake2b(obs.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _cap(messages: list[dict], max_chars: int) -> list[dict]:
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str) and len(c) > max_chars:
            m = {**m, "content": c[:max_chars] + _TRUNC_MARK.format(n=len(c) - max_chars)}
        out.append(m)
    return out


class EpisodeStrategy(Protocol):
    """A strategy that runs one episode instead of the built-in turn loop (e.g. an outside agent
    program through a recording endpoint: ``agentrl.agents``). It fills ``traj`` (task, outcome,
    reward) and leaves its token buffers in ``state["ep"]`` (``ids``, ``mask``, ``logprobs``,
    ``turn_ids``, ``versions``, ``turns``, ``messages``, ``prompt_len``), the env in ``state["env"]``
    (closed for it) and, when the episode split, the earlier buffers in ``state["earlier"]``."""

    async def run(self, manager: EpisodeManager, spec: EpisodeSpec, traj: Trajectory, state: dict) -> None: ...


class EpisodeManager(EpisodeSource):
    """Runs episodes of one env against one engine (an :class:`~agentrl.episodes.source.EpisodeSource`).

    ``env_factory()`` returns a fresh env per episode (Gymnasium-style, with ``areset``/``astep``
    preferred over ``reset``/``step``); ``tokenizer`` is the model's HF tokenizer (its chat
    template renders prompts and observation deltas). The engine receives the episode's live id
    list as the prompt (no copy, so per-turn cost stays flat): engines must treat it as read-only
    and copy what they keep past the call. ``strategy`` (an :class:`EpisodeStrategy`) runs each episode
    instead of the built-in loop; its episodes may yield several trajectories (``run_segments``).
    """

    def __init__(
        self,
        engine: Engine,
        env_factory: Callable[[], Any],
        tokenizer: PreTrainedTokenizerBase,
        cfg: RolloutConfig | None = None,
        env_id: str = "",
        strategy: EpisodeStrategy | None = None,
    ) -> None:
        self.engine, self.env_factory, self.tokenizer = engine, env_factory, tokenizer
        self.strategy = strategy
        self.cfg = cfg or RolloutConfig()
        self.env_id = env_id
        self.metrics = RolloutMetrics()
        self._renderers: dict[str, ChatRenderer] = {}
        self._cancelled = asyncio.Event()
        self._inflight: set[asyncio.Future] = set()

    # -- public -------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop starting episodes; running ones end now as ``cancelled`` and are still yielded."""
        self._cancelled.set()
        for t in list(self._inflight):
            t.cancel()

    async def stream(self, specs: Iterable[EpisodeSpec]) -> AsyncIterator[Trajectory]:
        """Run ``specs`` with at most ``cfg.max_concurrency`` in flight; yield each Trajectory as it
        finishes. Every spec yields exactly one Trajectory (failures included), unless cancelled
        before it started; a strategy's episode that split yields its earlier segments too."""
        it = iter(specs)
        out: asyncio.Queue = asyncio.Queue()
        done = object()

        async def worker() -> None:
            try:
                while not self._cancelled.is_set():
                    spec = next(it, None)
                    if spec is None:
                        break
                    for traj in await self.run_segments(spec):
                        await out.put(traj)
            finally:
                await out.put(done)

        n_workers = self.cfg.max_concurrency
        workers = [asyncio.create_task(worker()) for _ in range(n_workers)]
        finished = 0
        try:
            while finished < n_workers:
                item = await out.get()
                if item is done:
                    finished += 1
                    continue
                yield item
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def collect(
        self, specs: Iterable[EpisodeSpec], on_result: Callable[[Trajectory], None] | None = None
    ) -> list[Trajectory]:
        results = []
        async for t in self.stream(specs):
            results.append(t)
            if on_result:
                on_result(t)
        return results

    async def run_episode(self, spec: EpisodeSpec) -> Trajectory:
        """Run one episode to its end; never raises (except CancelledError of the caller's task).
        The episode's (last) trajectory: use ``run_segments`` when a strategy may split episodes."""
        return (await self.run_segments(spec))[-1]

    async def run_segments(self, spec: EpisodeSpec) -> list[Trajectory]:
        """``run_episode``, with the earlier segments of an episode the strategy split before its
        trajectory (the built-in loop never splits: one trajectory)."""
        await admission()  # backpressure: a saturated sandbox holds new episodes back
        t0 = time.perf_counter()
        traj = Trajectory(
            episode_id=f"{spec.group_id}-{spec.sample_index}",
            group_id=spec.group_id,
            env_id=self.env_id,
            prompt_len=0,
            sample_index=spec.sample_index,
        )
        state: dict[str, Any] = {}
        run = self.strategy.run(self, spec, traj, state) if self.strategy is not None else self._run(spec, traj, state)
        inner = asyncio.ensure_future(run)
        self._inflight.add(inner)
        try:
            if self._cancelled.is_set():
                inner.cancel()
            async with asyncio.timeout(self.cfg.episode_timeout_s):
                await inner
        except TimeoutError:
            self._fail(traj, Outcome.DEADLINE, f"episode passed its {self.cfg.episode_timeout_s}s deadline")
        except EpisodeError as e:
            self._fail(traj, Outcome(e.outcome), f"{type(e).__name__}: {e}")
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not self._cancelled.is_set() or (me is not None and me.cancelling()):
                raise  # our caller is being cancelled, not just this episode
            self._fail(traj, Outcome.CANCELLED, "cancelled")
        except Exception as e:  # a bug in an env or renderer must not take the batch down
            self._fail(traj, Outcome.ENV_ERROR, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
        finally:
            self._inflight.discard(inner)
            env = state.get("env")
            if env is not None:
                try:
                    env.close()
                except Exception:
                    pass
            if state.get("ep") is not None:
                write_tokens(traj, state["ep"])
            traj.info["tool_stats"] = state.get("tool_stats", {})
            traj.wall_s = time.perf_counter() - t0
            self.metrics.add(traj)
        return [*segment_trajectories(traj, state.get("earlier") or []), traj]

    # -- internals ----------------------------------------------------------------------------
    @staticmethod
    def _fail(traj: Trajectory, outcome: Outcome, detail: str) -> None:
        traj.outcome, traj.outcome_detail, traj.reward = outcome, detail, 0.0
        traj.info.pop("reward_components", None)

    def _renderer(self, tools: list[dict] | None) -> ChatRenderer:
        key = json.dumps(tools or [], sort_keys=True)
        r = self._renderers.get(key)
        if r is None:
            if len(self._renderers) > 32:
                self._renderers.clear()
            r = self._renderers[key] = ChatRenderer(self.tokenizer, tools=tools or None)
        return r

    async def _env_call(self, env: Any, name: str, *args: Any, **kw: Any) -> Any:
        afn = getattr(env, "a" + name, None)
        if afn is not None:
            return await afn(*args, **kw)
        return await asyncio.to_thread(getattr(env, name), *args, **kw)

    async def _run(self, spec: EpisodeSpec, traj: Trajectory, state: dict) -> None:
        cfg = self.cfg
        try:
            env = state["env"] = self.env_factory()
            obs, info = await self._env_call(env, "reset", seed=spec.task_seed, options=spec.options)
        except EpisodeError:
            raise
        except Exception as e:
            raise EnvError(f"env reset failed: {type(e).__name__}: {e}") from e
        traj.task = info.get("task", {})
        traj.tools = list(info.get("tools") or [])
        renderer = self._renderer(info.get("tools"))
        ep = state["ep"] = EpisodeBuffer(renderer.prompt_ids(info["messages"]), info["messages"])
        traj.prompt_len = len(ep.ids)
        stats = state["tool_stats"] = {}
        base = SamplingParams(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop_token_ids=tuple(renderer.stop_token_ids),
            seed=spec.sampling_seed,
            stop=stop_strings(cfg.stop, env),
        )
        for turn in range(cfg.max_turns):
            budget = cfg.max_context - len(ep.ids)
            if budget < cfg.min_turn_tokens:
                self._end(traj, Outcome.CONTEXT_OVERFLOW, f"{len(ep.ids)} tokens leave {budget} < min_turn_tokens")
                return
            params = replace(
                base,
                max_new_tokens=min(cfg.max_new_tokens, budget),
                seed=None if base.seed is None else (base.seed + 7919 * turn) % (2**31),
            )
            key = state_key_of(env, obs if isinstance(obs, str) else "")
            t_gen = time.perf_counter()
            gen = await self._generate(ep.ids, params, traj.episode_id)
            t_env = time.perf_counter()
            rec = TurnRecord(
                index=turn,
                start=len(ep.ids),
                n_sampled=len(gen.token_ids),
                n_observation=0,
                finish_reason=gen.finish_reason,
                gen_s=t_env - t_gen,
                state_key=key,
            )
            ep.turns.append(rec)
            versions = gen.versions or [self.engine.policy_version] * len(gen.token_ids)
            ep.add_sampled(gen.token_ids, gen.logprobs, versions, turn)
            text = renderer.decode(gen.token_ids)
            ep.messages.append({"role": "assistant", "content": text})
            if gen.finish_reason != "stop":
                if cfg.score_truncated:  # the cut text is scored as the final answer (it rarely holds one)
                    _, reward, terminated, _, sinfo = await self._step(env, text)
                    rec.env_s, rec.reward = time.perf_counter() - t_env, float(reward)
                    add_reward_components(traj, sinfo)
                    traj.reward = float(reward) if terminated else 0.0
                self._end(traj, Outcome.TRUNCATED_LENGTH, f"turn {turn} hit its token limit ({params.max_new_tokens})")
                return
            obs, reward, terminated, truncated, sinfo = await self._step(env, text)
            rec.env_s = time.perf_counter() - t_env
            rec.reward = float(reward)
            add_reward_components(traj, sinfo)
            ts = sinfo.get("tool_stats", {})
            for k, v in ts.items():
                stats[k] = stats.get(k, 0) + v
            rec.tool_calls, rec.tool_errors = ts.get("calls", 0), ts.get("errors", 0)
            if terminated:
                traj.reward = float(reward)
                self._end(traj, Outcome.OK, "")
                return
            if truncated:
                self._end(traj, Outcome.TRUNCATED_TURNS, "env truncated the episode")
                return
            new_msgs = _cap(sinfo.get("messages", []), cfg.max_obs_chars)
            delta = renderer.observation_ids(new_msgs)
            if gen.token_ids[-1] != renderer.end_of_turn_id:
                # stopped on another stop id (e.g. <|endoftext|>): close the turn the way the template
                # does, as glue (mask 0), so the observation delta lines up with the template again
                delta = renderer.close_ids([]) + delta
            if len(ep.ids) + len(delta) + cfg.min_turn_tokens > cfg.max_context:
                self._end(
                    traj,
                    Outcome.CONTEXT_OVERFLOW,
                    f"observation of {len(delta)} tokens would leave no room under max_context={cfg.max_context}",
                )
                return
            ep.add_observation(delta, turn)
            ep.messages.extend(new_msgs)
            rec.n_observation = len(delta)
        self._end(traj, Outcome.TRUNCATED_TURNS, f"reached max_turns={cfg.max_turns}")

    @staticmethod
    def _end(traj: Trajectory, outcome: Outcome, detail: str) -> None:
        traj.outcome, traj.outcome_detail = outcome, detail

    async def _guarded(self, coro, what: str, on_timeout: type[EpisodeError], on_error: type[EpisodeError]):
        """Await ``coro`` under the turn deadline; map a timeout or a foreign exception to an EpisodeError."""
        try:
            async with asyncio.timeout(self.cfg.turn_timeout_s):
                return await coro
        except TimeoutError as e:
            raise on_timeout(f"{what} passed the {self.cfg.turn_timeout_s}s turn deadline") from e
        except EpisodeError:
            raise
        except Exception as e:
            raise on_error(f"{what} failed: {type(e).__name__}: {e}") from e

    async def _generate(self, ids: list[int], params: SamplingParams, session: str):
        gen = await self._guarded(
            self.engine.generate(ids, params, session=session), "generation", EngineError, EngineError
        )
        if len(gen.logprobs) != len(gen.token_ids) or (gen.versions and len(gen.versions) != len(gen.token_ids)):
            raise EngineError(f"engine returned {len(gen.token_ids)} ids but {len(gen.logprobs)} logprobs")
        if not gen.token_ids:
            raise EngineError("engine returned no tokens")
        return gen

    async def _step(self, env: Any, text: str):
        return await self._guarded(self._env_call(env, "step", text), "env step", ToolTimeoutError, EnvError)
