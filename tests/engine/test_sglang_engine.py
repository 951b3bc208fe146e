"""SGLangEngine against real SGLang servers (marked sglang; they skip, saying why, where SGLang cannot
start), plus router and retry tests that need no server.

Server budget: these tests share the session's one ``sglang_server``. The two-server routing test
attaches the engine to that server under two URLs (127.0.0.1 and localhost): two backends the
router must tell apart, one process. The crash test supervises (and restarts) the same server, so
it runs last and restores the original weights.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import pytest
from refused_port import refused_port

from agentrl.engine.base import SamplingParams
from agentrl.engine.router import Router
from agentrl.engine.sglang.engine import SGLangEngine
from agentrl.engine.sglang.wire import load_stats, sampling_params, to_generation
from agentrl.errors import EngineError

STATS_KEYS = {
    "engine/servers",
    "engine/healthy_servers",
    "engine/running_reqs",
    "engine/waiting_reqs",
    "engine/kv_used_tokens",
    "engine/kv_capacity_tokens",
    "engine/kv_usage",
    "engine/kv_usage_max",
    "engine/cache_hit_rate",
    "engine/gen_throughput",
    "engine/inflight",
    "engine/resends",
    "engine/restarts",
    "engine/connect_errors",
    "engine/lost",
    "engine/http_errors",
}


def run(coro, timeout_s: float = 300.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


# --- no server needed ---------------------------------------------------------------------------
def test_router_sticky_and_least_loaded():
    r = Router(["http://a", "http://b"])
    a = r.pick("ep1")
    a.inflight += 1
    b = r.pick("ep2")
    assert b is not a  # least loaded
    b.inflight += 5
    assert r.pick("ep1") is a and r.pick("ep2") is b  # sticky despite the load
    assert r.pick("ep3") is a  # new session -> least loaded
    b.healthy = False
    assert r.pick("ep2") is a  # its server is down: re-routed
    assert r.session_server("ep2") == a.url  # and stays there


def test_router_forgets_old_sessions():
    r = Router(["http://a", "http://b"], max_sessions=3)
    for i in range(5):
        r.pick(f"s{i}")
    assert r.session_server("s0") is None and r.session_server("s4") is not None


def test_constructor_validates():
    with pytest.raises(EngineError, match="either urls"):
        SGLangEngine()
    with pytest.raises(ValueError, match="duplicate"):
        SGLangEngine(["http://x:1", "http://x:1"])
    with pytest.raises(EngineError, match="retries=-1"):
        SGLangEngine(["http://x:1"], retries=-1)


@pytest.fixture
def dead_url():
    """A URL where connecting is refused for the whole test (tests/refused_port.py)."""
    with refused_port() as port:
        yield f"http://127.0.0.1:{port}"


def test_dead_port_retries_with_backoff_then_engine_error(dead_url):
    url = dead_url
    eng = SGLangEngine([url], retries=2, backoff_s=0.05)

    async def go():
        t0 = time.perf_counter()
        try:
            with pytest.raises(EngineError, match=r"unreachable after 3 tries") as ei:
                await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
            return ei.value, time.perf_counter() - t0
        finally:
            await eng.close()

    err, elapsed = run(go(), 60)
    assert url in str(err)
    b = eng.router.backends[0]
    assert b.counts["connect_errors"] == 3 and b.counts["sent"] == 3 and b.counts["ok"] == 0
    assert eng.resends == 0  # never delivered, so never a re-send
    assert elapsed >= 0.05 + 0.1  # it slept backoff_s * (1 + 2) between the tries


def test_answer_mapping_versions_and_checks():
    """How an SGLang answer becomes a Generation (crafted answers in SGLang 0.5.23's format)."""

    def answer(ids, finish, spans=None):
        meta = {
            "finish_reason": finish,
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
            "weight_version": "3",
            "prompt_tokens": 2,
        }
        if spans is not None:
            meta["weight_versions"] = spans
        return {"output_ids": ids, "meta_info": meta}

    def gen(data):
        return to_generation(data, "http://x:1", 7)

    g = gen(
        answer(
            [4, 5, 2],
            {"type": "stop", "matched": 2},
            [{"version": "3", "start": 0, "end": 1}, {"version": "4", "start": 1, "end": 3}],
        )
    )
    assert (g.token_ids, g.logprobs, g.finish_reason, g.versions) == ([4, 5, 2], [-0.5] * 3, "stop", [3, 4, 4])
    assert gen(answer([4, 5], {"type": "length", "length": 2})).versions == [3, 3]
    unlabelled = gen(answer([4], {"type": "abort", "message": "x"}, [{"version": "default"}]))
    assert unlabelled.versions == [7] and unlabelled.finish_reason == "abort"
    with pytest.raises(EngineError, match="trimmed"):
        gen(answer([4, 5], {"type": "stop", "matched": 2}))
    with pytest.raises(EngineError, match="unknown finish_reason"):
        gen(answer([4], {"type": "weird"}))
    bad = answer([4, 5], {"type": "length"})
    bad["meta_info"]["output_token_logprobs"][1][1] = 9
    with pytest.raises(EngineError, match="differ"):
        gen(bad)
    with pytest.raises(EngineError, match="x:1 sent an answer without ids"):
        gen({"text": "hi"})


def test_sampling_params_payload():
    sp = sampling_params(SamplingParams(max_new_tokens=9, top_k=0, stop_token_ids=(2, 5), seed=4), 7)
    assert sp["max_new_tokens"] == 7 and sp["top_k"] == -1 and sp["stop_token_ids"] == [2, 5]
    assert sp["sampling_seed"] == 4 and sp["no_stop_trim"] is True and sp["skip_special_tokens"] is False
    assert "stop_token_ids" not in sampling_params(SamplingParams(), 1)


def test_load_stats_sums_servers_and_skips_the_silent():
    one = {
        "loads": [
            {
                "num_running_reqs": 2,
                "num_waiting_reqs": 1,
                "num_used_tokens": 100,
                "max_total_num_tokens": 1000,
                "token_usage": 0.1,
                "cache_hit_rate": 0.5,
                "gen_throughput": 10.0,
            }
        ]
    }
    two = {
        "loads": [
            {
                "num_running_reqs": 3,
                "num_waiting_reqs": 0,
                "num_used_tokens": 300,
                "max_total_num_tokens": 1000,
                "token_usage": 0.3,
                "cache_hit_rate": 0.0,
                "gen_throughput": 5.0,
            }
        ]
    }
    s = load_stats([one, two, EngineError("down")])
    assert s["engine/healthy_servers"] == 2 and s["engine/running_reqs"] == 5 and s["engine/waiting_reqs"] == 1
    assert s["engine/kv_usage"] == pytest.approx(0.2) and s["engine/kv_usage_max"] == pytest.approx(0.3)
    assert s["engine/cache_hit_rate"] == pytest.approx(0.25) and s["engine/gen_throughput"] == 15.0


def test_failed_restart_fails_fast(tmp_path):
    """A supervised server that cannot restart (its python exits at once: a real process, no SGLang
    needed) is restarted once by the failing request, which then ends in EngineError; it is not
    restarted again for every retry."""
    from agentrl.engine.sglang.server import SGLangServer

    server = SGLangServer(tmp_path, python="/bin/false", startup_timeout_s=30, log_path=tmp_path / "log")
    eng = SGLangEngine(servers=[server], retries=3, backoff_s=0.01)
    eng.supervisor.HEALTH_INTERVAL_S = 3600.0  # keep the health checks out of this test

    async def go():
        try:
            with pytest.raises(EngineError, match="unreachable after 4 tries"):
                await eng.generate([1, 2], SamplingParams(max_new_tokens=2))
        finally:
            await eng.close()

    run(go(), 120)
    b = eng.router.backends[0]
    assert b.counts["restarts"] == 1 and server.restarts == 1 and b.failed_restart and not b.healthy
    assert b.counts["connect_errors"] == 4 and eng.resends == 0


# --- live server ---------------------------------------------------------------------------------
@pytest.fixture()
def attached(sglang_server):
    return SGLangEngine([sglang_server.url])


@pytest.mark.sglang
def test_generate_ids_logprobs_and_stop(attached, sglang_model_dir):
    eng = attached

    async def go():
        try:
            g = await eng.generate([5, 6, 7], SamplingParams(max_new_tokens=6))
            everything = tuple(range(2052))  # every id stops: the first sampled token ends the turn
            s = await eng.generate([5, 6, 7], SamplingParams(max_new_tokens=6, stop_token_ids=everything))
            with pytest.raises(EngineError, match="outside the vocabulary"):
                await eng.generate([5, 99999], SamplingParams(max_new_tokens=2))
            with pytest.raises(EngineError, match="max_context=4096"):
                await eng.generate([5] * 4096, SamplingParams(max_new_tokens=2))
            return g, s
        finally:
            await eng.close()

    g, s = run(go())
    assert eng.max_context == 4096  # from the model's config.json, found through /server_info
    assert len(g.token_ids) == len(g.logprobs) == len(g.versions) == 6 and g.finish_reason == "length"
    assert all(lp <= 0 for lp in g.logprobs) and g.versions == [0] * 6
    assert s.finish_reason == "stop" and len(s.token_ids) == 1 and len(s.logprobs) == 1
    assert g.info["server"] == eng.urls[0] and g.info["resent"] is False


@pytest.mark.sglang
def test_sticky_and_least_loaded_across_two_backends(sglang_server):
    port = sglang_server.port
    eng = SGLangEngine([f"http://127.0.0.1:{port}", f"http://localhost:{port}"])
    p = SamplingParams(max_new_tokens=4)

    async def go():
        try:
            await eng.start()
            # 8 concurrent sessions: least-loaded sends 4 to each backend
            first = await asyncio.gather(*(eng.generate([5, 6, 7 + i], p, session=f"ep{i}") for i in range(8)))
            # later turns of every session return to the server of its first turn
            later = [await eng.generate([5, 6, 7 + i, 9], p, session=f"ep{i}") for i in range(8) for _ in range(2)]
            return first, later
        finally:
            await eng.close()

    first, later = run(go())
    a, b = eng.router.backends
    assert a.counts["ok"] == b.counts["ok"] == 12  # 4 first turns + 8 later turns each
    home = {f"ep{i}": g.info["server"] for i, g in enumerate(first)}
    assert sorted(home.values()).count(a.url) == 4
    for j, g in enumerate(later):
        assert g.info["server"] == home[f"ep{j // 2}"]


@pytest.mark.sglang
def test_attached_failover_to_a_healthy_server(sglang_server, dead_url):
    dead = dead_url
    eng = SGLangEngine([dead, sglang_server.url], backoff_s=0.01)

    async def go():
        try:
            return [await eng.generate([5, 6, 7], SamplingParams(max_new_tokens=2), session=f"s{i}") for i in range(4)]
        finally:
            await eng.close()

    gens = run(go())
    d, live = eng.router.backends
    assert all(g.info["server"] == live.url for g in gens)
    assert not d.healthy and d.counts["ok"] == 0 and live.counts["ok"] == 4


@pytest.mark.sglang
def test_server_stats_keys(attached):
    async def go():
        try:
            await attached.generate([5, 6, 7], SamplingParams(max_new_tokens=2))
            return await attached.server_stats()
        finally:
            await attached.close()

    stats = run(go())
    assert set(stats) == STATS_KEYS
    assert all(isinstance(v, float) for v in stats.values())
    assert stats["engine/kv_capacity_tokens"] == 32768 and stats["engine/healthy_servers"] == 1
    assert 0 <= stats["engine/kv_usage"] <= 1


@pytest.mark.sglang
def test_pause_resume_with_requests_in_flight(attached):
    eng = attached
    n = 256  # long enough to be still running when pause() lands, even on an idle machine
    p = SamplingParams(max_new_tokens=n)

    async def go():
        try:
            await eng.start()
            before = [asyncio.create_task(eng.generate([5, 6, 7, i], p)) for i in range(6)]
            while eng.router.backends[0].inflight < 6:
                await asyncio.sleep(0.01)
            await eng.pause()
            running = [not t.done() for t in before]
            during = asyncio.create_task(eng.generate([8, 9], SamplingParams(max_new_tokens=4)))
            await asyncio.sleep(1.5)
            paused_done = during.done()
            await eng.flush_cache()  # retract mode lets the cache be flushed with requests paused
            eng.set_policy_version(1)
            await eng.resume()
            gens = await asyncio.gather(*before, during)
            eng.set_policy_version(0)  # leave the shared server at version 0
            await eng.pause()
            await eng.resume()
            return paused_done, running, gens
        finally:
            await eng.close()

    paused_done, running, gens = run(go())
    assert not paused_done  # a request made while paused waits for resume
    assert any(running), "every request finished before pause(): nothing was paused"
    for g, was_running in zip(gens[:-1], running):
        # nothing lost: each ran to its limit (or to an eos, which SGLang always stops on)
        assert (len(g.token_ids) == n and g.finish_reason == "length") or g.finish_reason == "stop"
        assert set(g.versions) <= {0, 1} and g.versions == sorted(g.versions)
        if was_running:  # it continued after resume, under the new version
            assert g.versions[-1] == 1
    assert gens[-1].versions == [1] * len(gens[-1].token_ids)


# --- the crash test ------------------------------------------------------------------------------
class _TurnsEnv:
    """Three assistant turns that need no model skill: any answer gets "again", the third ends it."""

    TURNS = 3

    def __init__(self) -> None:
        self.turn = 0

    async def areset(self, seed=None, options=None):
        self.turn = 0
        return None, {"messages": [{"role": "user", "content": f"Task {seed}: say anything."}]}

    async def astep(self, text):
        self.turn += 1
        if self.turn >= self.TURNS:
            return None, 1.0, True, False, {}
        return None, 0.0, False, False, {"messages": [{"role": "user", "content": "again"}]}

    def close(self) -> None:
        pass


def _always_stop_model(src, dst, stop_id: int):
    """A copy of ``src`` whose next token is ``stop_id`` with probability ~1: every layer's output
    projections are zeroed (the last hidden state is the normalised input embedding), all
    embeddings share a positive first coordinate, and the (tied) stop row points along it."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    sd = load_file(os.path.join(dst, "model.safetensors"))
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k] = torch.zeros_like(sd[k])
    emb = sd["model.embed_tokens.weight"]
    emb[:, 0] = 1.0
    emb[stop_id] = 0.0
    emb[stop_id, 0] = 4.0
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


@pytest.mark.sglang
def test_crash_during_64_concurrent_episodes(sglang_server, sglang_model_dir, tmp_path):
    """SIGKILL the supervised server while 64 multi-turn episodes run: every episode ends ok or
    engine_error, none hangs, none is lost or duplicated, the server is restarted (reloading the
    engine's weights_path) and each lost request is re-sent at most once."""
    from transformers import AutoTokenizer

    from agentrl.config.schema import RolloutConfig
    from agentrl.episodes.chat import ChatRenderer
    from agentrl.episodes.manager import EpisodeManager, make_specs
    from agentrl.trajectory import Outcome

    tok = AutoTokenizer.from_pretrained(sglang_model_dir)
    stop_id = tok.convert_tokens_to_ids("<|im_end|>")
    stop_dir = _always_stop_model(sglang_model_dir, tmp_path / "stop-model", stop_id)
    eng = SGLangEngine(servers=[sglang_server], backoff_s=0.2)
    cfg = RolloutConfig(
        max_turns=5, max_new_tokens=4, max_concurrency=64, turn_timeout_s=240, episode_timeout_s=400, temperature=1.0
    )
    restarts_before = sglang_server.restarts
    specs = make_specs(16, 4, seed=3)

    async def go():
        try:
            await eng.post_all("/update_weights_from_disk", {"model_path": stop_dir})
            eng.note_weights(stop_dir, 0)
            prompt = ChatRenderer(tok).prompt_ids([{"role": "user", "content": "hi"}])
            probe = await eng.generate(prompt, SamplingParams(max_new_tokens=4, stop_token_ids=(stop_id,)))
            assert probe.token_ids == [stop_id], f"the always-stop model sampled {probe.token_ids}"
            mgr = EpisodeManager(eng, _TurnsEnv, tok, cfg, env_id="turns")
            run_task = asyncio.create_task(mgr.collect(specs))
            b = eng.router.backends[0]
            # kill once a turn's worth of answers came back and requests are in flight
            while not (b.counts["ok"] >= 48 and b.inflight >= 8) and not run_task.done():
                await asyncio.sleep(0.02)
            inflight_at_kill = b.inflight
            os.killpg(sglang_server.proc.pid, signal.SIGKILL)
            t_kill = time.perf_counter()
            trajs = await asyncio.wait_for(run_task, 500)  # none hangs
            print(f"crash test: episodes ended {time.perf_counter() - t_kill:.1f}s after the kill")
            after = await eng.generate([5, 6, 7], SamplingParams(max_new_tokens=2))
            stats = await eng.server_stats()
            return trajs, inflight_at_kill, after, stats
        finally:
            try:
                await eng.post_all("/update_weights_from_disk", {"model_path": str(sglang_model_dir)})
            finally:
                await eng.close()

    trajs, inflight_at_kill, after, stats = run(go(), 700)
    b = eng.router.backends[0]
    ids = [t.episode_id for t in trajs]
    assert len(trajs) == 64 and len(set(ids)) == 64  # none lost, none duplicated
    assert set(ids) == {f"{s.group_id}-{s.sample_index}" for s in specs}
    outcomes = [t.outcome for t in trajs]
    assert set(outcomes) <= {Outcome.OK, Outcome.ENGINE_ERROR}, [(t.outcome, t.outcome_detail) for t in trajs]
    assert inflight_at_kill > 0 and b.counts["lost"] >= 1  # the kill hit requests in flight
    assert sglang_server.restarts == restarts_before + 1 and b.counts["restarts"] == 1
    assert sglang_server.alive() and after.token_ids == [stop_id]  # restarted server reloaded weights_path
    # each request delivered at most twice: every re-send follows its loss, a second loss is an error
    assert 1 <= eng.resends <= b.counts["lost"] and b.counts["resent"] == eng.resends
    assert b.counts["lost"] - eng.resends <= outcomes.count(Outcome.ENGINE_ERROR)
    assert b.counts["sent"] == b.counts["ok"] + b.counts["lost"] + b.counts["connect_errors"] + b.counts["http_errors"]
    assert stats["engine/restarts"] == 1 and stats["engine/resends"] == eng.resends
    for t in trajs:
        if t.outcome == Outcome.OK:
            assert sum(t.loss_mask) == _TurnsEnv.TURNS and len(t.turns) == _TurnsEnv.TURNS
    print(
        f"crash test: {outcomes.count(Outcome.OK)} ok, {outcomes.count(Outcome.ENGINE_ERROR)} engine_error, "
        f"{inflight_at_kill} in flight at the kill, {eng.resends} re-sent; server counters {b.counts}"
    )
