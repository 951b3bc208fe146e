"""`agentrl doctor`: every check reports (and one that breaks becomes a row), JSON and table output,
the token never printed, stand-ins for a Hub, an SGLang server and a Ray head; the smoke run (slow)."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import components
import pytest
import torch
from refused_port import refused_port
from typer.testing import CliRunner

from agentrl.cli import doctor
from agentrl.cli.main import app
from agentrl.config.schema import RunConfig, load_config

runner = CliRunner()
SECRET = "hf_DoctorSecret42"


class _Server:
    """A tiny HTTP server answering every GET/HEAD with ``body`` as JSON."""

    def __init__(self, body: dict):
        payload = json.dumps(body).encode()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, send_body: bool):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if send_body:
                    self.wfile.write(payload)

            def do_GET(self):
                self._reply(True)

            def do_HEAD(self):
                self._reply(False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_doctor_json_reports_every_check_and_never_the_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    names = [r["name"] for r in rows]
    for want in ("python", "torch", "cuda", "nccl", "docker", "bubblewrap", "sandbox", "ray", "hf hub", "run device"):
        assert want in names, names
    assert any(n.startswith("sglang") for n in names)
    assert all(r["status"] in ("ok", "no", "warn", "info") for r in rows)
    by = {r["name"]: r for r in rows}
    assert "offline (HF_HUB_OFFLINE=1)" in by["hf hub"]["detail"] and "HF_TOKEN set" in by["hf hub"]["detail"]
    assert by["sandbox"]["detail"].startswith("env code_exec: sandbox: ")
    if not torch.cuda.is_available():
        assert by["cuda"]["status"] == "no"
        assert by["run device"]["detail"].startswith("device: cpu, dtype float32")
    assert SECRET not in res.output


def test_doctor_table(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = runner.invoke(app, ["doctor", "--set", "model.dtype=float32"])
    assert res.exit_code == 0, res.output
    assert "agentrl doctor" in res.output and "run device" in res.output and "bubblewrap" in res.output


def test_doctor_bad_config_is_one_error_line():
    res = runner.invoke(app, ["doctor", "--set", "model.dtype=int4"])
    assert res.exit_code == 2 and "model.dtype" in res.output


def test_a_broken_check_becomes_a_warn_row():
    def check_boom(cfg):
        raise RuntimeError("probe exploded\nsecond line")

    rows = doctor.run_checks(RunConfig(), [doctor.check_device, check_boom])
    assert rows[-1] == doctor.Check("boom", "warn", "check failed: RuntimeError: probe exploded")


def test_cuda_rows_with_cuda_mocked(monkeypatch):
    class Props:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    (row,) = doctor.check_cuda(RunConfig())
    assert row.status == "ok" and row.detail.startswith("2 device(s): cuda:0 NVIDIA H100 80GB HBM3 (80.0 GiB)")
    (dev,) = doctor.check_device(RunConfig())
    assert dev.detail.startswith("device: cuda (2 x NVIDIA H100 80GB HBM3), dtype bfloat16")


def test_hub_reachable_and_down(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub = _Server({})
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        (row,) = doctor.check_hub(RunConfig())
        assert row.status == "ok" and f"{hub.url} answers (HTTP 200)" in row.detail and "no HF_TOKEN" in row.detail
    finally:
        hub.close()
    with refused_port() as port:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        (row,) = doctor.check_hub(RunConfig())
    assert row.status == "warn" and "not reachable" in row.detail


def test_configured_sglang_server_version():
    server = _Server({"version": "0.5.23", "model_path": "/models/x"})
    try:
        cfg = load_config([], ["engine.kind=sglang", f"engine.urls=['{server.url}']"])
        (row,) = doctor.check_sglang(cfg)
        assert row.status == "ok" and "SGLang 0.5.23" in row.detail and "/models/x" in row.detail
    finally:
        server.close()
    with refused_port() as port:
        cfg = load_config([], ["engine.kind=sglang", f"engine.urls=['http://127.0.0.1:{port}']"])
        (row,) = doctor.check_sglang(cfg)
    assert row.status == "warn" and "not answering" in row.detail


def test_local_sglang_names_the_setup_command(tmp_path, monkeypatch):
    """No SGLang: the row names `agentrl setup sglang`; a python whose sglang is not the pinned release: a warning
    naming both versions. A shell script stands in for the virtualenv's python (it prints a version)."""
    from agentrl.engine.sglang.install import SGLANG_VERSION

    monkeypatch.delenv("AGENTRL_SGLANG_PYTHON", raising=False)
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)  # nor in this interpreter
    (row,) = doctor.check_sglang(RunConfig())
    assert row.status == "no" and "run `agentrl setup sglang`" in row.detail
    fake = tmp_path / "python"
    monkeypatch.setenv("AGENTRL_SGLANG_PYTHON", str(fake))
    for version, status in ((SGLANG_VERSION, "ok"), ("0.4.0", "warn")):
        fake.write_text(f"#!/bin/sh\necho {version}\n")
        fake.chmod(0o755)
        (row,) = doctor.check_sglang(RunConfig())
        assert row.status == status and f"sglang {version} installed ({fake})" in row.detail
    assert f"tested with {SGLANG_VERSION}: run `agentrl setup sglang`" in row.detail


def test_ray_cluster_reachable_or_not(monkeypatch):
    pytest.importorskip("ray", reason=components.reason("ray", "ray is not installed (pip install 'agentrl[ray]')"))
    with socket.socket() as head:  # a listening socket stands in for the GCS port
        head.bind(("127.0.0.1", 0))
        head.listen()
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{head.getsockname()[1]}")
        rows = doctor.check_ray(RunConfig())
        assert rows[0].status == "ok" and rows[1].status == "ok" and "answers" in rows[1].detail
    with refused_port() as port:
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        rows = doctor.check_ray(RunConfig())
    assert rows[1].status == "warn" and "no answer" in rows[1].detail


def test_launcher_row(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    (row,) = doctor.check_launcher(RunConfig())
    assert row.status == "warn" and "distributed: ray" in row.detail
    monkeypatch.delenv("WORLD_SIZE")
    assert doctor.check_launcher(RunConfig()) == []


@pytest.mark.slow
def test_doctor_smoke_runs_two_steps(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = runner.invoke(
        app,
        ["doctor", "--json", "--smoke", "--set", f"model.path={tiny_model_dir}", "--set", "rollout.max_context=512"],
    )
    rows = json.loads(res.output)
    assert rows[-1]["name"] == "smoke run" and rows[-1]["status"] == "ok", rows[-1]
    assert res.exit_code == 0
