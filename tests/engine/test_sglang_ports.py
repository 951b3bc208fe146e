"""The SGLang launcher's port: a port taken before the server binds it (issue 31: ``[Errno 98] error
while attempting to bind on address``) means a launch on a fresh port, a bounded number of times,
noted in the server's log; another program answering ``/health`` on the port is never taken for the
server. A stand-in process plays SGLang (no SGLang needed): it "loads" for a moment, then binds
``--port`` and answers ``/health``, or logs uvicorn's bind error and hangs, as SGLang 0.5.23 does
(measured: "Waiting for application shutdown" for ever)."""

from __future__ import annotations

import http.server
import sys
import threading

import pytest

import agentrl.engine.sglang.server as launcher
from agentrl.common.ports import free_port, listener_is_ours
from agentrl.engine.sglang.engine import SGLangEngine
from agentrl.engine.sglang.server import SGLangServer
from agentrl.errors import EngineError

STAND_IN = """
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
time.sleep(0.3)  # loading the model: the port is free for anyone meanwhile

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

try:
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
except OSError as e:
    print(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('127.0.0.1', {port}): "
          f"{e.strerror.lower()}", flush=True)
    print("INFO:     Waiting for application shutdown.", flush=True)
    time.sleep(3600)  # as SGLang 0.5.23 does: it never exits after this error
print(f"INFO:     Uvicorn running on http://127.0.0.1:{port}", flush=True)
server.serve_forever()
"""


class _Squatter(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # another program's server: answers /health like SGLang would
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def squatter():
    """Another program's HTTP server listening on a port (``.server_address[1]``)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Squatter)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _server(tmp_path, monkeypatch, port=None) -> SGLangServer:
    (tmp_path / "config.json").write_text("{}")
    server = SGLangServer(tmp_path, port=port, python=sys.executable, log_path=tmp_path / "server.log")
    # command() is asked at every launch: the stand-in gets the port of that launch
    monkeypatch.setattr(server, "command", lambda: [sys.executable, "-c", STAND_IN, "--port", str(server.port)])
    return server


def _picks(monkeypatch, *ports: int) -> None:
    """The launcher's free_port returns ``ports`` first (ports someone takes), then really free ones."""
    queue = list(ports)
    monkeypatch.setattr(launcher, "free_port", lambda host="127.0.0.1": queue.pop(0) if queue else free_port(host))


def test_a_port_taken_before_the_server_binds_it_means_a_launch_on_a_fresh_one(tmp_path, monkeypatch, squatter):
    taken = squatter.server_address[1]
    _picks(monkeypatch, taken)
    server = _server(tmp_path, monkeypatch)
    assert server.port == taken
    try:
        server.start()  # the squatter's /health is not our server's
        assert server.port != taken and server.alive() and server.healthy()
        assert listener_is_ours(server.port, server.proc.pid) is not False
        log = server.log_path.read_text()
        assert "address already in use" in log and log.count("=== agentrl: starting") == 2
        assert f"=== agentrl: port {taken} was taken before the server could bind it" in log
        assert f"starting again on port {server.port} (launch 2 of 3)" in log

        # a restart whose port was taken meanwhile moves too
        server.kill()
        squatter2 = http.server.ThreadingHTTPServer(("127.0.0.1", server.port), _Squatter)
        threading.Thread(target=squatter2.serve_forever, daemon=True).start()
        try:
            moved_from = server.port
            server.restart()
            assert server.port not in (moved_from, taken) and server.healthy() and server.restarts == 1
        finally:
            squatter2.shutdown()
            squatter2.server_close()
    finally:
        server.stop(grace_s=1)
    assert not server.alive()


def test_retries_are_bounded_and_the_error_says_why(tmp_path, monkeypatch, squatter):
    taken = squatter.server_address[1]
    _picks(monkeypatch, *[taken] * 5)
    server = _server(tmp_path, monkeypatch)
    with pytest.raises(EngineError, match=rf"port {taken} on 127.0.0.1 is in use .*3 free ports tried"):
        server.start()
    assert not server.alive() and server.log_path.read_text().count("=== agentrl: starting") == 3


def test_a_port_given_is_not_changed(tmp_path, monkeypatch, squatter):
    taken = squatter.server_address[1]
    server = _server(tmp_path, monkeypatch, port=taken)
    with pytest.raises(EngineError, match=rf"port {taken} on 127.0.0.1 is in use .*pass a free port, or none"):
        server.start()
    assert server.port == taken and not server.alive()
    assert server.log_path.read_text().count("=== agentrl: starting") == 1


def test_the_engine_follows_a_server_that_moved(tmp_path):
    class Moved:
        url = "http://127.0.0.1:1111"

    server = Moved()
    engine = SGLangEngine(servers=[server])
    b = engine.router.backends[0]
    server.url = "http://127.0.0.1:2222/"
    engine.supervisor.follow(b)
    assert b.url == "http://127.0.0.1:2222" and engine.urls == ["http://127.0.0.1:2222"]


class _Remote:
    """``actor.method`` as Ray gives it: ``.remote()`` returns an awaitable of the answer."""

    def __init__(self, answer):
        self.answer = answer

    def remote(self):
        async def get():
            return self.answer()

        return get()


class _EngineActor:
    def __init__(self, url: str):
        self.url = url
        self.ready = self.info = _Remote(lambda: {"url": self.url})


async def test_a_rollout_workers_client_follows_its_engine_actors_server(monkeypatch):
    import httpx

    from agentrl.distributed.sglang_engines import SGLangClient

    actor = _EngineActor("http://127.0.0.1:2222")  # ready() moved it from the URL info() gave first
    client = SGLangClient(["http://127.0.0.1:1111"], actors=(actor,))

    async def started(self):
        self._started = True

    monkeypatch.setattr(SGLangEngine, "start", started)
    await client.start()
    assert client.urls == ["http://127.0.0.1:2222"]
    actor.url = "http://127.0.0.1:3333"  # restarted on a fresh port: the next probe asks the actor
    client.admin.client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    assert await client._probe(client.router.backends[0])
    assert client.urls == ["http://127.0.0.1:3333"]
    await client.admin.client.aclose()
