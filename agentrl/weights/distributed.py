"""Weight sync over a process group: :class:`DistributedSync` and the trainer's side of its group.

Owns :class:`DistributedSync` (``/init_weights_update_group`` once, then per push flattened buckets
announced by ``/update_weights_from_distributed`` and broadcast from rank 0; NCCL on GPUs, gloo also
on CPU; see ``agentrl.weights.base`` for the seam) and :class:`WeightGroup`:
creating a process group of its own (rank 0 = this process, hosting the TCP rendezvous; the
servers' ranks join through ``/init_weights_update_group``) WITHOUT touching the default process
group (the trainer may run FSDP in one), broadcasting a tensor from rank 0, and destroying the group.
SGLang builds its side with a ``PrefixStore(group_name)`` over the ``tcp://`` rendezvous store and
torch's process-group helper; this module does the same on rank 0 so both sides meet on the same
keys. That helper is a private torch API (``_new_process_group_helper``): it is the only way to make
a group that is not the default one and not a sub-group of it. Does not gather weights or decide when to sync.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from datetime import timedelta
from typing import Any

from agentrl.errors import EngineError
from agentrl.weights.base import ServerSync, buckets

_GROUP_IDS = itertools.count()


class WeightGroup:
    """Rank 0 of a ``world_size`` process group named ``group_name`` on ``backend`` (``nccl``
    or ``gloo``). :meth:`listen` opens the rendezvous (``master_port`` 0: a port the OS chooses,
    held from then on, so no other process can take it before the group forms); :meth:`connect`
    blocks until every rank joined (run it while the servers join)."""

    def __init__(
        self,
        *,
        master_address: str,
        master_port: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
        timeout_s: float = 300.0,
    ) -> None:
        if backend not in ("nccl", "gloo"):
            raise EngineError(f"weight group backend must be 'nccl' or 'gloo', got {backend!r}")
        if world_size < 2:
            raise EngineError(f"weight group world_size must be >= 2 (trainer + servers), got {world_size}")
        self.master_address, self.master_port = master_address, master_port
        self.world_size, self.group_name, self.backend = world_size, group_name, backend
        self.timeout = timedelta(seconds=timeout_s)
        self.pg: Any = None
        self.store: Any = None

    def listen(self) -> int:
        """Open the rendezvous store (once); the port the servers must join."""
        import torch.distributed as dist

        if self.store is None:
            try:
                self.store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]  (not in its __all__)
                    "0.0.0.0",
                    self.master_port,
                    self.world_size,
                    is_master=True,
                    timeout=self.timeout,
                    wait_for_workers=False,
                )
            except Exception as e:
                where = f"port {self.master_port}"
                raise EngineError(
                    f"weight group {self.group_name!r}: cannot listen on {where}: {type(e).__name__}: {e}"
                ) from e
            self.master_port = self.store.port
        return self.master_port

    def connect(self) -> None:
        from torch.distributed.distributed_c10d import GroupName, PrefixStore, _new_process_group_helper

        self.listen()
        store = self.store
        try:
            self.pg, _ = _new_process_group_helper(
                self.world_size,
                0,
                [],
                self.backend,
                PrefixStore(self.group_name, store),
                group_name=GroupName(self.group_name),  # a NewType of str
                backend_options=None,
                timeout=self.timeout,
            )
        except Exception as e:  # torch raises DistStoreError/RuntimeError with the reason
            where = f"{self.backend}, world {self.world_size}, {self.master_address}:{self.master_port}"
            raise EngineError(
                f"weight group {self.group_name!r} ({where}) failed to form: {type(e).__name__}: {e}"
            ) from e

    def broadcast(self, tensor: Any) -> None:
        """Send ``tensor`` from rank 0 to every rank; blocks until done."""
        import torch.distributed as dist

        if self.pg is None:
            raise EngineError(f"weight group {self.group_name!r} is not connected")
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        try:
            self.pg.broadcast([tensor], opts).wait()
        except Exception as e:
            raise EngineError(f"weight group {self.group_name!r}: broadcast failed: {type(e).__name__}: {e}") from e

    def destroy(self) -> None:
        import torch.distributed as dist

        pg, self.pg = self.pg, None
        self.store = None  # closes the rendezvous port once the group lets go of it too
        if pg is None:
            return
        try:
            dist.destroy_process_group(pg)
        except Exception:  # not registered with the default world (no default group): shut it down
            try:
                pg.shutdown()
            except Exception:
                pass


class DistributedSync(ServerSync):
    """``/init_weights_update_group`` once, then per push ``bucket_bytes`` buckets, each announced by
    ``/update_weights_from_distributed`` (flattened bucket) and sent by a broadcast from rank 0.
    ``backend="nccl"`` needs GPUs (tensors go to ``device``, default ``cuda``); ``"gloo"`` also runs
    on CPU. ``tp_size``: ranks per server (rank_offset of server i is 1 + i * tp_size).

    A failed push (a server refused or died mid-broadcast) drops the group; the next push forms a
    new one under a new name with every server (a server restarted by SGLangEngine serves its
    launch weights until then). A broadcast left waiting for a receiver that never comes ends at
    ``timeout_s``. ``master_address``: where this process hosts the rendezvous (default
    :func:`rendezvous_address` of the servers' URLs, so servers on other nodes can join)."""

    name = "distributed"

    def __init__(
        self,
        engine: Any,
        backend: str = "nccl",
        *,
        master_address: str | None = None,
        master_port: int | None = None,
        bucket_bytes: int = 512 << 20,
        tp_size: int = 1,
        group_name: str = "agentrl_weights",
        device: str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        super().__init__(engine)
        if backend not in ("nccl", "gloo"):
            raise EngineError(f"DistributedSync backend must be 'nccl' or 'gloo', got {backend!r}")
        if bucket_bytes < 1 or tp_size < 1:
            raise EngineError(f"DistributedSync: bucket_bytes ({bucket_bytes}) and tp_size ({tp_size}) must be >= 1")
        # null: an address of this host the servers can reach (127.0.0.1 only when they all run here)
        self.backend, self.master_port = backend, master_port
        self.master_address = master_address or rendezvous_address(list(engine.urls))
        self.bucket_bytes, self.tp_size, self.group_prefix = bucket_bytes, tp_size, group_name
        self.group_name = ""
        self.device = device or ("cuda" if backend == "nccl" else "cpu")
        self.timeout_s = timeout_s
        self.group: WeightGroup | None = None

    async def _connect(self) -> None:
        import httpx

        # a fresh name per group: torch keeps a destroyed group's name registered in this process
        self.group_name = f"{self.group_prefix}_{os.getpid()}_{next(_GROUP_IDS)}"
        urls = list(self.engine.urls)
        group = WeightGroup(
            master_address=self.master_address,
            master_port=self.master_port or 0,
            world_size=1 + len(urls) * self.tp_size,
            group_name=self.group_name,
            backend=self.backend,
            timeout_s=self.timeout_s,
        )
        port = group.listen()

        async def join(i: int, url: str, client: httpx.AsyncClient) -> None:
            payload = {
                "master_address": self.master_address,
                "master_port": port,
                "rank_offset": 1 + i * self.tp_size,
                "world_size": group.world_size,
                "group_name": self.group_name,
                "backend": self.backend,
            }
            await _check(
                await client.post(url + "/init_weights_update_group", json=payload), url, "/init_weights_update_group"
            )

        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            local = asyncio.create_task(asyncio.to_thread(group.connect))
            remote = asyncio.gather(*(join(i, u, client) for i, u in enumerate(urls)))
            results = await asyncio.gather(local, remote, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            group.destroy()
            raise EngineError(f"DistributedSync: forming the weight group failed: {'; '.join(map(str, errors))}")
        self.group = group

    async def _load(self, named: list, version: int, phases: dict[str, float]) -> None:
        import torch

        if self.group is None:
            t0 = time.perf_counter()
            await self._connect()
            phases["connect_s"] = time.perf_counter() - t0
        parts = buckets(named, self.bucket_bytes)
        group = self.group
        assert group is not None  # _connect sets it or raises

        async def calls() -> None:
            for i, bucket in enumerate(parts):
                last = i == len(parts) - 1
                flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in bucket]).to(self.device)
                meta = {
                    "names": [n for n, _ in bucket],
                    "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                    "shapes": [list(t.shape) for _, t in bucket],
                    "group_name": self.group_name,
                    "load_format": "flattened_bucket",
                    "flush_cache": last,
                    "weight_version": str(version) if last else None,
                }
                send = asyncio.create_task(asyncio.to_thread(group.broadcast, flat))
                announce = asyncio.create_task(self.engine.post_all("/update_weights_from_distributed", meta))
                done, _ = await asyncio.wait({send, announce}, return_when=asyncio.FIRST_EXCEPTION)
                if announce in done and announce.exception() is not None and not send.done():
                    # the servers refused: the broadcast waits for receivers that never come
                    raise EngineError(f"DistributedSync: servers refused bucket {i}: {announce.exception()}")
                await asyncio.gather(send, announce)

        try:
            await self._session(calls)
        except BaseException:
            await self._drop_group(wait_local=False)
            raise

    async def _drop_group(self, wait_local: bool = True) -> None:
        group, self.group = self.group, None
        if group is None:
            return
        try:
            await self.engine.post_all(
                "/destroy_weights_update_group", {"group_name": group.group_name}, timeout_s=30.0
            )
        except EngineError:
            pass  # a dead or restarted server has no group left to destroy
        if wait_local:  # after a failure a broadcast may still hold the group: let it time out instead
            group.destroy()

    async def close(self) -> None:
        await self._drop_group()


LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def rendezvous_address(urls: list[str]) -> str:
    """The address of this host that the servers at ``urls`` reach it by: 127.0.0.1 when every
    server is on loopback, else the local address the OS routes to the first remote server (a UDP
    "connect" sends nothing). EngineError naming the server when no route exists."""
    import socket
    from urllib.parse import urlsplit

    remote = [u for u in urls if (urlsplit(u).hostname or "127.0.0.1") not in LOOPBACK]
    if not remote:
        return "127.0.0.1"
    parts = urlsplit(remote[0])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((parts.hostname, parts.port or 80))
            return s.getsockname()[0]
    except OSError as e:
        raise EngineError(
            f"DistributedSync: no route from this host to server {remote[0]} ({e}); set master_address"
        ) from e


async def _check(resp: Any, url: str, path: str) -> dict:
    try:
        body = resp.json()
    except ValueError:
        body = {"message": resp.text}
    if resp.status_code != 200 or (isinstance(body, dict) and body.get("success") is False):
        msg = body.get("message") if isinstance(body, dict) else body
        raise EngineError(f"SGLang server {url}: POST {path} -> HTTP {resp.status_code}: {str(msg)[:500]}")
    return body
