"""The steps of each SGLang weight-sync path, driven against ``FakeServerEngine`` (no server): the
order pause -> load -> version -> resume, what is posted, what lands on disk, and that a failed load
still resumes generation. The live-server checks of the same paths are in test_weight_sync.py."""

from __future__ import annotations

import asyncio
import base64
import json
import pickle

import pytest
import torch
from safetensors.torch import load_file

from agentrl.engine.sglang import disk as sglang_disk
from agentrl.errors import EngineError
from agentrl.weights.disk import DiskSync
from agentrl.weights.factory import SYNC_KINDS, make_weight_sync
from agentrl.weights.fake import FakeServerEngine, FakeSync
from agentrl.weights.tensor import TensorSync


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(4, 3, generator=g)
    return {"embed.weight": emb, "lm_head.weight": emb, "norm.weight": torch.ones(3)}  # tied, as Qwen's


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (d / "tokenizer.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"old weights: never copied")
    return d


def test_disk_sync_writes_a_loadable_dir_then_loads_it_while_paused(tmp_path, model_dir):
    eng = FakeServerEngine()
    sync = DiskSync(eng, tmp_path / "w", model_path=model_dir, keep=1)
    stats = asyncio.run(sync.push(state(), 3))
    path = tmp_path / "w" / "v00000003"
    assert [c[0] for c in eng.calls] == ["pause", "post", "note", "version", "resume"]
    assert eng.calls[1] == (
        "post",
        "/update_weights_from_disk",
        {"model_path": str(path), "weight_version": "3", "flush_cache": True},
    )
    assert eng.weights_path == str(path) and eng.policy_version == 3 and not eng.paused
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    back = load_file(str(path / "model.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in state().items())
    assert stats.path == "disk" and stats.version == 3 and stats.bytes == 4 * (12 + 12 + 3)
    assert {"write_s", "pause_s", "load_s", "resume_s"} <= set(stats.phases)
    asyncio.run(sync.push(state(1), 4))  # keep=1: the older directory goes
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v00000004"]


def test_a_refused_load_still_resumes_and_keeps_the_old_version(tmp_path, model_dir):
    eng = FakeServerEngine(fail_path="/update_weights_from_disk")
    eng.set_policy_version(2)
    with pytest.raises(EngineError, match="POST /update_weights_from_disk -> HTTP 500"):
        asyncio.run(DiskSync(eng, tmp_path / "w", model_path=model_dir).push(state(), 3))
    assert eng.calls[-1] == ("resume",) and not eng.paused and eng.policy_version == 2


def test_tensor_sync_posts_buckets_in_a_session_and_flushes_once(tmp_path):
    eng = FakeServerEngine(urls=("http://a:1", "http://b:2"))
    sd = {f"t{i}": torch.full((8,), float(i)) for i in range(3)}  # 32 bytes each
    asyncio.run(TensorSync(eng, bucket_bytes=64, tp_size=2).push(sd, 5))
    assert eng.posted() == [
        "/begin_weight_update",
        "/update_weights_from_tensor",
        "/update_weights_from_tensor",
        "/end_weight_update",
    ]
    loads = [c[2] for c in eng.calls if c[0] == "post" and c[1] == "/update_weights_from_tensor"]
    assert [p["flush_cache"] for p in loads] == [False, True]
    assert [p["weight_version"] for p in loads] == [None, "5"]
    names = []
    for p in loads:
        assert len(p["serialized_named_tensors"]) == 2  # one payload per tp rank
        names += [n for n, _ in pickle.loads(base64.b64decode(p["serialized_named_tensors"][0]))]
    assert names == ["t0", "t1", "t2"] and eng.policy_version == 5


def test_engine_update_weights_takes_the_disk_format_without_the_weights_package(monkeypatch, model_dir):
    """SGLangEngine.update_weights (engine.sglang.disk.load_from_disk): same steps and directory
    format as DiskSync, in the engine's own temp dir, newest kept."""

    async def model_path(url, who, hint=""):
        assert url == "http://fake-server:1"
        return model_dir

    monkeypatch.setattr(sglang_disk, "server_model_path", model_path)
    eng = FakeServerEngine()
    try:
        asyncio.run(sglang_disk.load_from_disk(eng, state(), 1))
        asyncio.run(sglang_disk.load_from_disk(eng, state(2), 2))
        parent = sglang_disk.default_weights_dir(eng)
        assert [p.name for p in parent.iterdir()] == ["v00000002"]
        assert eng.weights_path == str(parent / "v00000002") and eng.policy_version == 2
        assert [c[0] for c in eng.calls][-5:] == ["pause", "post", "note", "version", "resume"]
        with pytest.raises(EngineError, match="version must be an int >= 0"):
            asyncio.run(sglang_disk.load_from_disk(eng, state(), -1))
    finally:
        import shutil

        shutil.rmtree(sglang_disk.default_weights_dir(eng), ignore_errors=True)


def test_fake_sync_records_and_fails_on_request():
    eng = FakeServerEngine()
    sync = make_weight_sync("inprocess", object())  # the factory builds real paths...
    assert type(sync).__name__ == "InProcessSync" and set(SYNC_KINDS) == {
        "inprocess",
        "disk",
        "tensor",
        "distributed",
        "object_store",
    }
    fake = FakeSync(eng, fail_versions=(9,))  # ...the fake stands in for any of them
    stats = asyncio.run(fake.push(state(), 4))
    assert fake.pushes == [(4, ["embed.weight", "lm_head.weight", "norm.weight"])] and eng.policy_version == 4
    assert stats.bytes == 4 * (12 + 12 + 3)
    with pytest.raises(EngineError, match="version 9"):
        asyncio.run(fake.push(state(), 9))
    with pytest.raises(EngineError, match="empty"):
        asyncio.run(fake.push({}, 5))
    assert eng.policy_version == 4 and len(fake.pushes) == 1
    with pytest.raises(EngineError, match="unknown weight sync 'nfs'"):
        make_weight_sync("nfs", eng)
