"""Agent callables for the proxy-mode tests (``agent.callable=probe_agents:NAME``): the example
agent (examples/agents/openai_loop.py, loaded from its file) with the endpoint URL it was given kept
in ``URLS``, and an agent that only records the URL and crashes; ``assert_closed`` checks that an
endpoint is gone."""

import importlib.util
import socket
from pathlib import Path
from urllib.parse import urlparse

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agents" / "openai_loop.py"
_spec = importlib.util.spec_from_file_location("openai_loop_example", EXAMPLE)
openai_loop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(openai_loop)

#: every base URL an agent here was given (the test checks the endpoint is gone after the run)
URLS: list[str] = []


async def example_agent(task, *, base_url, api_key):
    URLS.append(base_url)
    return await openai_loop.run(task, base_url=base_url, api_key=api_key)


async def crashing_agent(task, *, base_url, api_key):
    URLS.append(base_url)
    raise RuntimeError("planted agent crash")


def assert_closed(url):
    """Nothing listens on ``url``'s port any more: connecting is refused and the port binds again."""
    port = urlparse(url).port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no listener
        s.bind(("127.0.0.1", port))
