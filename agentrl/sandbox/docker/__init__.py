"""The Docker backend: ``sandbox`` (``DockerSandbox``), one run on a container (``run``), the warm pool
(``pool``), the container spec and daemon calls (``daemon``), the attach stream (``conn``), the offline
image build (``image``, and ``Dockerfile`` for registries), and the program that runs inside each
container (``agent``). Re-exports the backend and its probe."""

from agentrl.sandbox.docker.sandbox import DockerSandbox, DockerSession, unavailable_reason

__all__ = ["DockerSandbox", "DockerSession", "unavailable_reason"]
