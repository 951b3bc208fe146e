"""The package's layering, checked on the source: lower layers never import upward, no import cycles,
every package ``__init__`` only re-exports, and every module imports on its own.

Layers, lowest first (a module may import its own package and any package on a lower layer, at module
level or inside a function alike): ``LAYERS`` below. The order is the data path read bottom-up: the
sandbox runs what tools ask, envs use tools, episodes drive an engine against envs, the serving app answers
OpenAI-style requests over an engine, agents record outside programs through it, finished groups wait
in batches, the trainer learns from them, weights flow back to the engine, and jobs wire it all.

An agentrl import sits at module level unless it must not: one inside a function says why in a comment on
its line or the line above (``# lazy: pulls in torch``, ``# optional: ...``, ``# cycle: ...``).
"""

import ast
import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "agentrl"

LAYERS = [
    {"errors"},
    {"common"},
    {"trajectory"},
    {"sandbox", "algos", "models"},
    {"tools", "trainer"},
    {"envs", "engine"},
    {"weights"},
    {"episodes"},
    {"serving"},
    {"agents"},
    {"batches"},
    {"observe"},
    {"distributed"},
    {"warmstart"},
    {"config"},
    {"jobs"},
    {"cli"},
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path: Path) -> set[str]:
    """agentrl modules ``path`` imports anywhere (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {r for n in names if n.startswith("agentrl.") and (r := _resolve(n))}
    return out


GRAPH = {m: _imports(p) - {m} for m, p in MODULES.items()}


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_package_is_on_a_layer():
    pkgs = {_package(m) for m in MODULES} - {None, "__main__"}
    assert pkgs <= set(RANK), f"put these in LAYERS: {sorted(pkgs - set(RANK))}"


def test_the_layout_page_states_this_layer_order():
    """docs/layout.md's sentence ``(`errors` < `common` < ...; ...)`` lists LAYERS in order."""
    import re

    text = " ".join((ROOT.parent / "docs" / "layout.md").read_text().split())
    sentence = re.search(r"layer order \((`errors`.*?`cli`);", text)
    assert sentence, "docs/layout.md lost its layer-order sentence"
    stated = [set(re.findall(r"`(\w+)`", part)) for part in sentence.group(1).split(" < ")]
    assert stated == LAYERS


def test_no_module_imports_a_higher_layer():
    bad = []
    for m, targets in GRAPH.items():
        src = _package(m)
        if src in (None, "__main__"):
            continue
        for t in targets:
            dst = _package(t)
            if dst is not None and dst != src and RANK[dst] >= RANK[src]:
                bad.append(f"{m} -> {t}")
    assert not bad, "upward or sideways imports:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _imports_in_functions(tree: ast.AST):
    """Each agentrl import (absolute or relative) inside a function of ``tree``, once."""
    seen = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                ours = any(a.name == "agentrl" or a.name.startswith("agentrl.") for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] == "agentrl"
            else:
                continue
            if ours and node.lineno not in seen:
                seen.add(node.lineno)
                yield node


def test_every_import_inside_a_function_says_why():
    """An agentrl import inside a function has a comment on its line (any line of a wrapped import) or on
    the line above saying why it is not at module level: a heavy or optional dependency it defers, a
    cycle, a name tests replace. One that needs no reason belongs at the top of its module."""
    bad = []
    for p in MODULES.values():
        text = p.read_text()
        lines = text.splitlines()
        for node in _imports_in_functions(ast.parse(text)):
            own = lines[node.lineno - 1 : node.end_lineno]  # an import line holds no string: "#" starts a comment
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if not (above.startswith("#") or any("#" in line for line in own)):
                bad.append(f"{p.relative_to(ROOT.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, (
        "agentrl imports inside functions without a reason (move them to module level, or comment why, "
        "e.g. `# lazy: pulls in torch`):\n" + "\n".join(bad)
    )


def test_package_inits_only_reexport():
    allowed = (ast.Import, ast.ImportFrom, ast.Expr)  # Expr: the docstring
    bad = collections.defaultdict(list)
    for m, p in MODULES.items():
        if p.name != "__init__.py":
            continue
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, allowed):
                continue
            if isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id in ("__all__", "__version__", "_PUBLIC", "_LAZY") for t in node.targets
            ):
                continue
            if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
                continue  # lazy re-export (PEP 562)
            bad[m].append(f"line {node.lineno}: {type(node).__name__}")
    assert not bad, dict(bad)


#: run in one fresh interpreter: imports each module named in argv[1] (JSON) with no agentrl module
#: loaded before it (third-party modules stay loaded: they are not what is checked); prints failures
_IMPORT_EACH = """
import importlib, json, sys, traceback
bad = {}
for name in json.loads(sys.argv[1]):
    for k in [k for k in sys.modules if k == "agentrl" or k.startswith("agentrl.")]:
        del sys.modules[k]
    try:
        importlib.import_module(name)
    except BaseException as e:
        bad[name] = traceback.format_exception_only(type(e), e)[-1].strip()
print(json.dumps(bad))
"""


def test_every_module_imports_on_its_own():
    """An import that works only after some other module was imported first (a missing import, an
    order-dependent cycle) or fails at import time is named with its error."""
    names = sorted(m for m in MODULES if m.rpartition(".")[2] != "__main__")
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps(names)],
        cwd=ROOT.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not bad, "modules that do not import on their own:\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())
