"""``agentrl setup ...``: install the optional components a run can use that pip does not bring.

Owns: the typer sub-app mounted by ``agentrl.cli.main`` as ``agentrl setup``; today one command,
``agentrl setup sglang`` (the pinned SGLang in its own virtualenv). A thin shell: the work is in
``agentrl.engine.sglang.install``, which CI also runs (``.ci/install_sglang.sh``).

Does not: retry a failed download (run it again: a finished install is a no-op) or remove anything.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from agentrl.cli.errors import fail as _fail
from agentrl.errors import AgentRLError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Install optional components pip does not bring (SGLang in its own virtualenv).",
)
console = Console()


@app.command("sglang")
def sglang_cmd(
    python: str | None = typer.Option(
        None,
        "--python",
        help="Interpreter that creates the virtualenv when it does not exist yet (default: the one running agentrl; "
        "delete the virtualenv to change it).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="One line per phase instead of pip's output."),
) -> None:
    """Install the SGLang release agentrl is tested against into $AGENTRL_CACHE/sglang-venv (default
    ~/.cache/agentrl/sglang-venv), with its own torch, leaving this environment's alone; a no-op when it is there.
    The `sglang` engine finds it there."""
    from agentrl.engine.sglang.install import install  # lazy: keeps CLI start light

    def say(line: str) -> None:
        console.print(escape(line), highlight=False, soft_wrap=True)

    def echo(line: str) -> None:
        console.print("    " + escape(line), highlight=False, soft_wrap=True, style="dim")

    try:
        install(python=python, say=say, echo=None if quiet else echo)
    except AgentRLError as e:
        _fail(e, code=1)
