"""Whether the docker sandbox backend can run here, asked without choosing a backend.

Owns :func:`docker_unavailable_reason`: imports ``agentrl.sandbox.docker`` lazily (choosing ``local``
never imports the docker SDK) and runs its ``unavailable_reason()`` probe. A small module of its own
so that the backend choice (``agentrl.sandbox.factory``) and the local backend's isolation summary
(``agentrl.sandbox.local``) can both ask without importing each other. Does not choose a backend.
"""

from __future__ import annotations


def docker_unavailable_reason() -> str | None:
    """None when the docker backend can run here, else why not (module missing, no daemon, no image)."""
    try:
        from agentrl.sandbox import docker  # optional: an ImportError is the reason returned
    except ImportError as e:
        return f"agentrl.sandbox.docker cannot be imported: {e}"
    probe = getattr(docker, "unavailable_reason", None)
    if probe is None:
        return "agentrl.sandbox.docker has no unavailable_reason()"
    try:
        return probe()
    except Exception as e:  # a broken probe must not break backend choice
        return f"docker probe failed: {type(e).__name__}: {e}"
