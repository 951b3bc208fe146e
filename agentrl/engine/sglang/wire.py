"""SGLang's HTTP payloads as agentrl sees them (checked against SGLang 0.5.23), as pure functions.

Owns: SamplingParams -> ``/generate`` ``sampling_params``; a ``/generate`` answer -> Generation
(ids and logprobs exactly as sent, finish reason, per-token versions from ``weight_versions``
spans, with the consistency checks); ``/v1/loads`` answers -> the ``engine/*`` stats; the model
limits read from a local HF dir. Does not send requests (``agentrl.engine.sglang.engine``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.engine.base import Generation, SamplingParams
from agentrl.errors import EngineError

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}

#: counters of the engine's own reported next to the server numbers
ENGINE_COUNTERS = ("restarts", "connect_errors", "lost", "http_errors")


def model_limits(model_path: str | None) -> tuple[int | None, int | None]:
    """(max_position_embeddings, vocab_size) from a local HF dir's config.json, else (None, None)."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text()) if model_path else {}
    except (OSError, ValueError):
        return None, None
    cfg = cfg.get("text_config", cfg)
    return cfg.get("max_position_embeddings"), cfg.get("vocab_size")


def sampling_params(p: SamplingParams, max_new_tokens: int) -> dict[str, Any]:
    """SGLang ``sampling_params``. ``no_stop_trim`` and no special-token skipping keep the text
    side from changing anything (a stop string's token stays in ``output_ids``); ``top_k=-1`` is SGLang's "off";
    ``seed`` -> ``sampling_seed``."""
    sp: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "no_stop_trim": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
    }
    if p.stop_token_ids:
        sp["stop_token_ids"] = [int(t) for t in p.stop_token_ids]
    if p.stop:
        sp["stop"] = list(p.stop)
    if p.seed is not None:
        sp["sampling_seed"] = int(p.seed)
    return sp


def token_versions(meta: dict, n: int, default: int) -> list[int]:
    """Per-token policy versions from ``meta_info.weight_versions`` spans (``weight_version`` when
    there are none); tokens in spans whose version is not an integer get ``default``."""
    out = [default] * n
    spans = meta.get("weight_versions") or [{"version": meta.get("weight_version"), "start": 0, "end": n}]
    for s in spans:
        try:
            v = int(s["version"])
        except (KeyError, TypeError, ValueError):
            continue
        for i in range(max(0, int(s.get("start", 0))), min(n, int(s.get("end", n)))):
            out[i] = v
    return out


def to_generation(data: dict, url: str, default_version: int) -> Generation:
    """A ``/generate`` answer (``return_logprob: true``) from the server at ``url`` -> Generation.
    Raises EngineError naming the server when the answer is malformed or inconsistent."""
    try:
        meta = data["meta_info"]
        ids = [int(t) for t in data["output_ids"]]
        pairs = meta["output_token_logprobs"]
        logprobs = [float(lp) for lp, _, *_ in pairs]
        lp_ids = [int(t) for _, t, *_ in pairs]
        fr = meta.get("finish_reason") or {}
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(
            f"SGLang server {url} sent an answer without ids/logprobs ({type(e).__name__}: {e}): {str(data)[:300]}"
        ) from e
    if lp_ids != ids:
        raise EngineError(f"SGLang server {url}: logprob ids {lp_ids[:8]}... differ from output_ids {ids[:8]}...")
    reason = _FINISH.get(fr.get("type") or "")  # "": no type, not a reason
    if reason is None:
        raise EngineError(f"SGLang server {url}: unknown finish_reason {fr!r}")
    matched = fr.get("matched")
    if reason == "stop" and isinstance(matched, int) and (not ids or ids[-1] != matched):
        raise EngineError(f"SGLang server {url} stopped on id {matched} but trimmed it from output_ids")
    if reason == "stop" and isinstance(matched, str) and not ids:
        raise EngineError(f"SGLang server {url} stopped on the string {matched!r} but sent no output_ids")
    info = {
        "server": url,
        "prompt_tokens": meta.get("prompt_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "latency_s": meta.get("e2e_latency"),
        "retractions": meta.get("num_retractions", 0),
    }
    if reason == "abort":
        info["abort"] = fr.get("message")
    return Generation(ids, logprobs, reason, token_versions(meta, len(ids), default_version), info)


def load_stats(loads: Sequence[dict | BaseException]) -> dict[str, float]:
    """``/v1/loads`` answers (one per server; an exception for a server that did not answer) ->
    ``engine/healthy_servers`` (servers that answered), ``engine/running_reqs``,
    ``engine/waiting_reqs`` (scheduler queues), ``engine/kv_used_tokens``,
    ``engine/kv_capacity_tokens``, ``engine/kv_usage`` (used / capacity over all servers),
    ``engine/kv_usage_max`` (fullest server), ``engine/cache_hit_rate`` (mean over servers),
    ``engine/gen_throughput`` (tokens/s, summed)."""
    keys = ("running_reqs", "waiting_reqs", "kv_used_tokens", "kv_capacity_tokens", "gen_throughput")
    out: dict[str, float] = dict.fromkeys(("engine/" + k for k in keys), 0.0)
    hit, usage_max, answered = [], 0.0, 0
    for r in loads:
        if isinstance(r, BaseException):
            continue
        answered += 1
        for ld in r.get("loads", []):
            out["engine/running_reqs"] += ld.get("num_running_reqs", 0)
            out["engine/waiting_reqs"] += ld.get("num_waiting_reqs", 0)
            out["engine/kv_used_tokens"] += ld.get("num_used_tokens", 0)
            out["engine/kv_capacity_tokens"] += ld.get("max_total_num_tokens", 0)
            out["engine/gen_throughput"] += ld.get("gen_throughput", 0.0)
            usage_max = max(usage_max, float(ld.get("token_usage", 0.0)))
            hit.append(float(ld.get("cache_hit_rate", 0.0)))
    cap = out["engine/kv_capacity_tokens"]
    out["engine/kv_usage"] = out["engine/kv_used_tokens"] / cap if cap else 0.0
    out["engine/kv_usage_max"] = usage_max
    out["engine/cache_hit_rate"] = sum(hit) / len(hit) if hit else 0.0
    out["engine/healthy_servers"] = float(answered)
    return out
