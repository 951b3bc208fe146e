"""The warm ``python3 -`` path of the local executor: a jailed fork of its interpreter runs the program.

Owns: ``run_python``, which runs the program on stdin as ``__main__`` of a fresh module as a cold
``python3 -`` would (``sys.argv == ['-']``, ``''`` first on ``sys.path``, the request's environment,
UTF-8 standard streams, ``SystemExit`` codes, a traceback and exit 1 on an uncaught exception,
non-daemon threads joined, atexit run), after forgetting the modules the executor imported after
start-up (so a ``json.py`` in the work dir shadows the standard one, as with a cold interpreter).
What still differs from a cold ``python3 -``: the str hash seed is the executor's, shared by all
calls (``random`` is reseeded). Imports only the standard library (see ``agentrl.sandbox.local.executor``).

Does not: jail anything (``agentrl.sandbox.local.child`` has, before it calls this).
"""

from __future__ import annotations

import os
import signal
import sys


def run_python(env: dict, startup_modules: frozenset = frozenset()) -> int:
    """The warm path: run the program on stdin as ``python3 -`` would; returns the exit code (or
    -signal to die of). Modules not in ``startup_modules`` (what the interpreter had at start) are
    forgotten first, so the program's imports resolve as in a cold interpreter (its work dir first)."""
    import builtins
    import io
    import types

    if startup_modules:
        for name in [m for m in sys.modules if m not in startup_modules]:
            del sys.modules[name]  # our own references keep working; the program re-imports

    # The dispositions a starting interpreter sets (prepare() gave the exec'd programs the defaults).
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    if "random" in sys.modules:
        sys.modules["random"].seed()
    with io.FileIO(0, "r", closefd=False) as f:
        source = f.readall()
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.argv = ["-"]
    sys.path.insert(0, "")
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, "<stdin>", "exec"), main.__dict__)
    except SystemExit as e:
        code = _system_exit_code(e)
    except BaseException as e:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1  # CPython dies of SIGINT then
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()  # join non-daemon threads, as interpreter exit does
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as e:
        code = _system_exit_code(e)
    except BaseException:
        pass
    return code


def _system_exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        print(e.code, file=sys.stderr)
    except BaseException:
        pass
    return 1
