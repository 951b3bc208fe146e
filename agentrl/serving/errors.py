"""The error a request to `agentrl serve` is answered with: :class:`APIError` (HTTP status + an
OpenAI-style ``{"error": {...}}`` body naming the field at fault).

Owns only that record, shared by the request handling (:mod:`agentrl.serving.api`,
:mod:`agentrl.serving.reply`) and the HTTP app (:mod:`agentrl.serving.app`). Does not decide
which requests are bad.
"""

from __future__ import annotations


class APIError(Exception):
    """A request the server answers with ``status`` and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}
