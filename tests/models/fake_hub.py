"""A local HTTP server standing in for the Hugging Face Hub, and a Hub-layout cache builder.

``FakeHub`` serves what ``huggingface_hub.snapshot_download`` asks for: model info
(``/api/models/{id}[/revision/{rev}]``), the recursive tree listing (``/api/models/{id}/tree/{rev}``)
and each file (HEAD/GET ``/{id}/resolve/{rev}/{file}`` with ``X-Repo-Commit``, ``ETag`` and
``Content-Length``). Repos are directories on disk; a gated repo answers 401 (``X-Error-Code:
GatedRepo``) unless the request carries ``Authorization: Bearer <its token>``; an unknown id answers
404 (``RepoNotFound``). Every request's path and Authorization header is recorded.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


def build_hub_cache(cache: Path, repo_id: str, model_dir: Path, commit: str = "a" * 40, ref: str = "main") -> Path:
    """Lay ``model_dir``'s files out as the HF cache does (``models--org--name/snapshots/<commit>/``
    and ``refs/<ref>``); returns the snapshot directory."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file():
            (snap / f.name).write_bytes(f.read_bytes())
    (folder / "refs").mkdir()
    (folder / "refs" / ref).write_text(commit)
    return snap


class FakeHub:
    def __init__(self, repos: dict[str, Path], gated: dict[str, str] | None = None, commit: str = "b" * 40):
        self.repos, self.gated, self.commit = repos, gated or {}, commit
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- routing ------------------------------------------------------------------------------
    def _files(self, repo: str) -> dict[str, Path]:
        return {f.name: f for f in sorted(self.repos[repo].iterdir()) if f.is_file()}

    def _send(self, h, status: int, payload: bytes, headers: dict, body: bool) -> None:
        h.send_response(status)
        for k, v in {"Content-Length": str(len(payload)), **headers}.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _error(self, h, status: int, code: str, body: bool) -> None:
        self._send(
            h,
            status,
            json.dumps({"error": code}).encode(),
            {"X-Error-Code": code, "Content-Type": "application/json"},
            body,
        )

    def _answer(self, h, body: bool) -> None:
        auth = h.headers.get("Authorization")
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, auth))
        api = path.startswith("/api/models/")
        parts = path.removeprefix("/api/models/").lstrip("/").split("/")
        repo = "/".join(parts[:2])
        if repo not in self.repos:
            return self._error(h, 404, "RepoNotFound", body)
        if repo in self.gated and auth != f"Bearer {self.gated[repo]}":
            return self._error(h, 401 if auth is None else 403, "GatedRepo", body)
        files = self._files(repo)
        rest = parts[2:]
        if api and (not rest or rest[0] == "revision"):
            info = {"id": repo, "sha": self.commit, "siblings": [{"rfilename": n} for n in files]}
            return self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        if api and rest[0] == "tree":
            tree = [
                {"type": "file", "path": n, "size": f.stat().st_size, "oid": hashlib.sha1(f.read_bytes()).hexdigest()}
                for n, f in files.items()
            ]
            return self._send(h, 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, body)
        if not api and len(rest) >= 3 and rest[0] == "resolve":
            name = "/".join(rest[2:])
            if name not in files:
                return self._error(h, 404, "EntryNotFound", body)
            data = files[name].read_bytes()
            etag = hashlib.sha256(data).hexdigest()
            return self._send(
                h,
                200,
                data,
                {"X-Repo-Commit": self.commit, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"},
                body,
            )
        return self._error(h, 404, "EntryNotFound", body)
