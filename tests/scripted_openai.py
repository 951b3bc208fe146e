"""ScriptedOpenAI: a scripted HTTP server speaking the OpenAI chat-completions wire format, for
tests of agentrl's own retry, parsing and tool-call plumbing through the real litellm client.

It is a fake endpoint (not a model): each POST to ``/v1/chat/completions`` takes the next scripted
answer — an int (answer with that HTTP status and an error body), a ``(status, message)`` pair
(``{authorization}`` in the message is replaced by the request's header, as providers that echo a
bad key do) or a dict (a message: ``content``
and optional ``tool_calls`` as ``[(name, arguments), ...]``, and ``finish_reason``). It records every
request (body and Authorization header) and the most requests it held at once (``max_inflight``;
a dict step's ``delay_s`` holds the answer back). Tests that claim to test a model endpoint use SGLang.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedOpenAI:
    def __init__(self, script: list, repeat_last: bool = True) -> None:
        self.script, self.repeat_last = list(script), repeat_last
        self.requests: list[dict] = []
        self.inflight = self.max_inflight = 0
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802
                with owner._lock:
                    owner.inflight += 1
                    owner.max_inflight = max(owner.max_inflight, owner.inflight)
                try:
                    self._answer()
                finally:
                    with owner._lock:
                        owner.inflight -= 1

            def _answer(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with owner._lock:
                    owner.requests.append(
                        {"path": self.path, "body": body, "authorization": self.headers.get("Authorization", "")}
                    )
                    i = len(owner.requests) - 1
                    step = (
                        owner.script[min(i, len(owner.script) - 1)]
                        if (owner.repeat_last or i < len(owner.script))
                        else 500
                    )
                if isinstance(step, int):
                    step = (step, f"scripted status {step}")
                if isinstance(step, tuple):
                    message = step[1].replace("{authorization}", self.headers.get("Authorization", ""))
                    self._send(step[0], {"error": {"message": message, "type": "invalid_request_error"}})
                    return
                time.sleep(step.get("delay_s", 0))
                calls = [
                    {
                        "id": f"tc-{i}-{k}",
                        "type": "function",
                        "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)},
                    }
                    for k, (n, a) in enumerate(step.get("tool_calls", []))
                ]
                msg = {"role": "assistant", "content": step.get("content")}
                if calls:
                    msg["tool_calls"] = calls
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{i}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "scripted"),
                        "choices": [
                            {
                                "index": 0,
                                "message": msg,
                                "finish_reason": step.get("finish_reason", "tool_calls" if calls else "stop"),
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    },
                )

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
