"""The documents name only code that exists and cite nothing outside the repository.

Every ``agentrl/...`` path and every dotted ``agentrl.x.y`` name in README.md, BENCHMARKS.md and the pages
under docs/ must resolve in this checkout (a path to a file or folder; a dotted name to a module or package, then to a
name that module defines or re-exports), and no document or file under agentrl/, bench/, configs/, tests/,
examples/, docs/ cites a guide (the word GUIDE). README's relative links point at files that exist (the docs
site's own links and anchors are checked by ``mkdocs build --strict`` in CI).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "BENCHMARKS.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
PATH_RE = re.compile(r"(?<![\w./-])agentrl/[\w./-]*[\w/]")
DOTTED_RE = re.compile(r"(?<![\w./-])agentrl(?:\.\w+)+")


ENV_ID = re.compile(r"-v\d+$")  # "agentrl/CodeExec-v0" is a Gymnasium env id, not a path


def _paths(text: str) -> set[str]:
    return {m.group(0).rstrip("/") for m in PATH_RE.finditer(text) if not ENV_ID.search(m.group(0))}


def _dotted(text: str) -> set[str]:
    return {m.group(0) for m in DOTTED_RE.finditer(text)}


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def resolve_dotted(name: str) -> str | None:
    """None when ``name`` resolves, else why not."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        mod = _module_file(parts[:cut])
        if mod is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if re.search(rf"\b{re.escape(rest[0])}\b", mod.read_text(encoding="utf-8")):
            return None
        return f"{'.'.join(parts[:cut])} ({mod.relative_to(ROOT)}) does not define {rest[0]!r}"
    return "no such module"


@pytest.mark.parametrize("doc", DOCS)
def test_every_agentrl_path_in_the_docs_exists(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    missing = sorted(p for p in _paths(text) if not (ROOT / p).exists())
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_dotted_agentrl_name_in_the_docs_resolves(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    bad = {n: why for n in sorted(_dotted(text)) if (why := resolve_dotted(n))}
    assert not bad, f"{doc} names modules or names that do not exist: {bad}"


def test_the_resolvers_reject_what_does_not_exist():
    assert resolve_dotted("agentrl.batches.staleness") is None
    assert resolve_dotted("agentrl.trajectory.Trajectory") is None
    assert resolve_dotted("agentrl.batches.no_such_module") is not None
    assert resolve_dotted("agentrl.trajectory.NoSuchClass") is not None
    assert _paths('see agentrl/jobs/run.py, `agentrl/sandbox/`, "agentrl/CodeExec-v0".') == {
        "agentrl/jobs/run.py",
        "agentrl/sandbox",
    }


def _texts():
    yield from (ROOT / d for d in [*DOCS, "CHANGELOG.md", "SCALING.md"])
    for folder in ("agentrl", "bench", "configs", "tests", "examples", "docs"):
        for p in sorted((ROOT / folder).rglob("*")):
            if p == Path(__file__).resolve():  # this test names the word it looks for
                continue
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".png", ".pyc"):
                yield p


def test_no_document_or_source_cites_a_guide():
    hits = []
    for p in _texts():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if "GUIDE" in text:
            hits.append(str(p.relative_to(ROOT)))
    assert not hits, f"these files cite a guide outside the repository: {hits}"


def test_readme_links_point_at_files_that_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert "docs/getting-started.md" in local
    missing = sorted(link for link in local if not (ROOT / link).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"
