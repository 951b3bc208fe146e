"""mkdocs hook: the pages generated from the code, made afresh on every ``mkdocs build``/``serve``.

Owns: ``reference/config.md`` (every field of the config tree with its default and doc, from
``agentrl.config.schema.field_docs``: the source of ``agentrl config --docs``), ``reference/cli.md``
(every command and option of the typer app, through typer's own markdown renderer), and the site's copies of
the repository's ``BENCHMARKS.md`` and ``CHANGELOG.md`` (kept at the top of the repository, where GitHub and
the package's readers look for them).

The build fails (a ``PluginError``, strict or not) when the config reference would miss a field: its rows are
checked against the fields ``agentrl config --docs`` prints and against a walk of the dataclass tree, and a
field without a doc fails it too. Broken links and anchors fail ``mkdocs build --strict`` through the
``validation`` settings of ``mkdocs.yml``.

Does not: write into ``docs/`` (the pages exist only in the build), or document sub-sections of
``env.kwargs`` (an env's own keywords: see the env's page).
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([\w.]+)` \|", re.M)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: object) -> str:
    text = repr(value)
    return f"`{_cell(text)}`" if len(text) <= 60 else f"`{_cell(text[:57])}...`"


def _leaves(cls: type, prefix: str = "") -> list[str]:
    """Every leaf field's dotted name, walked apart from ``field_docs`` (so a field it skipped shows)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


def config_page() -> str:
    from agentrl.config.schema import RunConfig, field_docs

    hints = typing.get_type_hints(RunConfig)
    lines = [
        "# Config reference",
        "",
        "Every field of the one config tree, with its default and its doc: the same source as",
        "`agentrl config --docs` (generated from `agentrl.config.schema.field_docs` when the site builds).",
        "Set a field with `--set a.b=c` or in a YAML file passed with `-c`; `agentrl config -c FILE --set ...`",
        "prints the resolved tree. A null default is filled when the job is planned (`agentrl.config.plan`):",
        "the resolved value is in the run's `config.yaml`. How the layers combine and which command reads what:",
        "[configuration](../guides/configuration.md).",
        "",
    ]
    rows = field_docs()
    sections: dict[str, list] = {}
    for name, text, default in rows:
        sections.setdefault(name.split(".")[0] if "." in name else "(top level)", []).append((name, text, default))
    for section, items in sections.items():
        lines += [f"## {section}", ""]
        cls = hints.get(section)
        text = " ".join((getattr(cls, "__doc__", None) or "").split())
        if dataclasses.is_dataclass(cls) and text and not text.startswith(f"{cls.__name__}("):  # not the generated one
            lines += [text, ""]
        lines += ["| field | default | doc |", "|---|---|---|"]
        lines += [f"| `{n}` | {_default(d)} | {_cell(t)} |" for n, t, d in items]
        lines.append("")
    lines.append(f"{len(rows)} fields.")
    page = "\n".join(lines) + "\n"
    check_config_page(page, rows, _leaves(RunConfig), cli_fields())
    return page


def cli_fields() -> list[str]:
    """The field names ``agentrl config --docs`` prints (its table's first column)."""
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    res = CliRunner().invoke(app, ["config", "--docs"], env={"COLUMNS": "1000"}, terminal_width=1000)
    if res.exit_code != 0:
        raise PluginError(f"`agentrl config --docs` failed (exit {res.exit_code}): {res.output[-2000:]}")
    names = []
    for line in res.output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) >= 3 and re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)*", cells[0]) and cells[0] != "field":
            names.append(cells[0])
    return names


def check_config_page(page: str, rows: list, leaves: list[str], cli: list[str]) -> None:
    listed = ROW.findall(page)
    problems = []
    for source, names in (("agentrl config --docs", cli), ("the config dataclasses", leaves)):
        missing = sorted(set(names) - set(listed))
        if missing:
            problems.append(f"fields of {source} missing from the config reference: {missing}")
    if len(cli) != len(listed):
        problems.append(f"`agentrl config --docs` prints {len(cli)} fields, the reference lists {len(listed)}")
    undocumented = [n for n, text, _ in rows if not text.strip()]
    if undocumented:
        problems.append(f"fields without a doc (add one with doc(...)): {undocumented}")
    if problems:
        raise PluginError("config reference: " + "; ".join(problems))


def cli_page() -> str:
    import click
    import typer.main
    from typer.cli import get_docs_for_click

    from agentrl.cli.main import app

    cmd = typer.main.get_command(app)
    text = get_docs_for_click(
        obj=cmd, ctx=click.Context(cmd, info_name="agentrl"), name="agentrl", title="CLI reference"
    )
    intro = (
        "Every command and option of `agentrl`, generated from the typer app (`agentrl.cli.main`) when the site "
        "builds; `agentrl COMMAND --help` prints the same. Every command but `sandbox` and `setup` takes "
        "`-c/--config` and `--set`: which fields each reads is in [configuration](../guides/configuration.md)."
    )
    return text.replace("# CLI reference\n", f"# CLI reference\n\n{intro}\n", 1)


# Links of the repository's top-level files, as the site has them
REPO_LINKS = [
    ("](docs/", "]("),
    ("](README.md", "](index.md"),
    ("](BENCHMARKS.md", "](benchmarks.md"),
    ("](CHANGELOG.md", "](changelog.md"),
]


def top_level_copy(name: str) -> str:
    text = (ROOT / name).read_text(encoding="utf-8")
    for old, new in REPO_LINKS:
        text = text.replace(old, new)
    return text


def on_files(files, config):
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-map download at import
    pages = {
        "reference/config.md": config_page(),
        "reference/cli.md": cli_page(),
        "benchmarks.md": top_level_copy("BENCHMARKS.md"),
        "changelog.md": top_level_copy("CHANGELOG.md"),
    }
    for uri, content in pages.items():
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} is generated by docs/_hooks/reference.py: remove the file")
        files.append(File.generated(config, uri, content=content))
    return files
