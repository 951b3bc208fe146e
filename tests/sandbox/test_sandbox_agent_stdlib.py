"""The program that runs inside every Docker sandbox container (``agentrl/sandbox/docker/agent/`` plus
``agentrl/sandbox/files.py``, which its bootstrap ships) imports only the standard library: the image
has a bare ``python3`` and nothing of agentrl. Checked on the source, so it runs without Docker."""

import ast
import sys
from pathlib import Path

from agentrl.sandbox.docker.conn import EXECUTOR_MODULES, executor_source

SANDBOX = Path(__file__).resolve().parents[2] / "agentrl" / "sandbox"
AGENT = SANDBOX / "docker" / "agent"
#: the names the bootstrap injects (``EXECUTOR_MODULES``): the agent imports its siblings by these
INJECTED = set(EXECUTOR_MODULES)


def _shipped() -> list[Path]:
    return sorted(AGENT.glob("*.py")) + [SANDBOX / "files.py"]


def _top_level_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: a relative import cannot work in the container"
            if node.module:
                out.add(node.module.partition(".")[0])
    return out


def test_the_in_container_program_imports_only_the_standard_library():
    bad = {}
    for path in _shipped():
        extra = _top_level_imports(path) - set(sys.stdlib_module_names) - INJECTED - {"__future__"}
        if extra:
            bad[str(path.relative_to(SANDBOX))] = sorted(extra)
    assert not bad, f"imports outside the standard library in the in-container program: {bad}"


def test_the_bootstrap_ships_every_file_of_the_agent():
    """Each file under ``docker/agent/`` reaches the container: as an injected module or as ``__main__``."""
    shipped = {p.resolve() for p in EXECUTOR_MODULES.values()} | {(AGENT / "executor.py").resolve()}
    missing = [p.name for p in AGENT.glob("*.py") if p.name != "__init__.py" and p.resolve() not in shipped]
    assert not missing, f"agent files the bootstrap does not ship: {missing}"
    src = executor_source()
    compile(src, "bootstrap", "exec")  # the source the container's python3 -c gets is valid Python
    assert all(repr(p.read_text(encoding="utf-8")) in src for p in shipped)
