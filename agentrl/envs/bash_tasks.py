"""Procedural shell tasks: files to inspect or fix in a work dir, a check of the result, a disjoint held-out split.

Owns: ``generate_task(seed, split, kinds)``, ``sample_task(rng, ...)``, ``eval_tasks(n, ...)`` and the check
program (:data:`CHECK_PROGRAM`) that scores a work dir. A task is a JSON-able dict ``{id, kind, prompt, files,
collect, expect, solution}``: ``files`` ({relative path: text}) is the work dir the agent starts with,
``collect`` the paths the check reads back after the agent is done, ``expect`` what the check compares them
with, ``solution`` a reference shell script (run in the work dir, it makes the check pass; never shown to the
model).

Kinds (``KINDS``):

- ``write_file``: write a given word into a named file;
- ``set_config``: change one key of an INI file, leaving every other key as it was;
- ``count_lines``: count the log lines of one level and write the number into a file;
- ``fix_script``: a Python script that fails (a misspelt file name or function name) must print the sum of
  the numbers in a data file; the check runs it against the original data file.

The check (:data:`CHECK_PROGRAM`, run by the env in a fresh sandbox holding only the collected files) reads
``{"nonce", "kind", "expect"}`` on stdin and prints one line, the nonce then ``{"ok": bool, "reason": str}``.
Like code_exec's grader it is not adversarially robust against a ``fix_script`` whose script forges that line
(the sandbox is the boundary; the script's own output goes to a pipe, not to the check's stdout).

Splits are disjoint by content, as in :mod:`agentrl.envs.tasks`: a task is held out iff a hash of its prompt
and files falls in a fixed 10% bucket, and the generator redraws until the task lands in the requested split.
Generation is a pure function of (seed, split, kinds). Does not: run anything (:mod:`agentrl.envs.bash_fix`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

import numpy as np

from agentrl.envs.tasks import distinct_tasks

SPLITS = ("train", "eval")
_EVAL_BUCKETS = 10  # 1 in 10 tasks is held out
_MAX_REDRAWS = 1000

_WORDS = (
    "amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kestrel",
    "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "tundra", "umber", "violet",
    "willow", "yarrow", "zephyr",
)  # fmt: skip
_FILES = ("note.txt", "answer.txt", "result.txt", "out.txt", "word.txt", "status.txt")
_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
_MESSAGES = (
    "request served", "cache miss", "disk almost full", "user logged in", "timeout talking to db",
    "retrying upload", "config reloaded", "worker restarted", "slow query", "connection reset",
)  # fmt: skip
_SECTIONS = {
    "server": ("host", "port", "workers", "timeout"),
    "database": ("name", "user", "pool_size", "retries"),
    "logging": ("level", "path", "rotate_days", "format"),
}


def _i(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def _pick(rng: np.random.Generator, items: Sequence[str]) -> str:
    return items[_i(rng, 0, len(items) - 1)]


def _value(rng: np.random.Generator, key: str) -> str:
    if key in ("port",):
        return str(_i(rng, 1024, 9999))
    if key in ("host",):
        return f"10.0.{_i(rng, 0, 255)}.{_i(rng, 1, 254)}"
    if key in ("name", "user", "path", "format", "level"):
        return _pick(rng, _WORDS)
    return str(_i(rng, 1, 64))


def _write_file(rng: np.random.Generator) -> dict:
    word, name = _pick(rng, _WORDS), _pick(rng, _FILES)
    return {
        "kind": "write_file",
        "prompt": f"Create a file named {name} in the current directory containing the single word {word}.",
        "files": {"README": "Put your answer in the current directory.\n"},
        "collect": [name],
        "expect": {"file": name, "value": word},
        "solution": f"echo {word} > {name}",
    }


def _set_config(rng: np.random.Generator) -> dict:
    config: dict[str, dict[str, str]] = {}
    for section, keys in _SECTIONS.items():
        config[section] = {k: _value(rng, k) for k in keys}
    section = _pick(rng, list(_SECTIONS))
    key = _pick(rng, _SECTIONS[section])
    new = _value(rng, key)
    while new == config[section][key]:
        new = _value(rng, key)
    name = _pick(rng, ("app.ini", "settings.ini", "service.conf"))
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) + "\n" for s, kv in config.items())
    return {
        "kind": "set_config",
        "prompt": (
            f"In the file {name} (current directory), set {key} in the [{section}] section to {new}. "
            "Leave every other setting as it is."
        ),
        "files": {name: text},
        "collect": [name],
        "expect": {"file": name, "section": section, "key": key, "value": new, "config": config},
        # every key is unique across sections: one line to change
        "solution": f"sed -i 's/^{key} = .*/{key} = {new}/' {name}",
    }


def _count_lines(rng: np.random.Generator) -> dict:
    level = _pick(rng, _LEVELS[1:3])
    lines = []
    for k in range(_i(rng, 6, 18)):
        lines.append(f"2024-05-{_i(rng, 1, 28):02d} 12:{k:02d}:00 {_pick(rng, _LEVELS)} {_pick(rng, _MESSAGES)}")
    count = sum(1 for line in lines if line.split()[2] == level)
    log, out = _pick(rng, ("server.log", "app.log", "events.log")), _pick(rng, ("count.txt", "errors.txt", "n.txt"))
    return {
        "kind": "count_lines",
        "prompt": (
            f"Count the lines of {log} (current directory) whose level is {level} and write that number "
            f"into a file named {out}."
        ),
        "files": {log: "\n".join(lines) + "\n"},
        "collect": [out],
        "expect": {"file": out, "value": str(count)},
        "solution": f"grep -c ' {level} ' {log} > {out}",
    }


def _fix_script(rng: np.random.Generator) -> dict:
    numbers = [_i(rng, 1, 99) for _ in range(_i(rng, 3, 8))]
    data = _pick(rng, ("numbers.txt", "values.txt", "data.txt"))
    script = _pick(rng, ("total.py", "sum.py", "report.py"))
    fn = _pick(rng, ("total_of", "add_up", "sum_values"))
    if _i(rng, 0, 1):  # a misspelt data file name
        bad, good, what = data.replace(".txt", "s.txt"), data, "file name"
        body = (
            f"def {fn}(path):\n    with open(path) as f:\n        return sum(int(x) for x in f.read().split())\n\n\n"
            f'print({fn}("{bad}"))\n'
        )
    else:  # a misspelt function name
        bad, good, what = fn + "s", fn, "function name"
        body = (
            f"def {fn}(path):\n    with open(path) as f:\n        return sum(int(x) for x in f.read().split())\n\n\n"
            f'print({bad}("{data}"))\n'
        )
    return {
        "kind": "fix_script",
        "prompt": (
            f"`python3 {script}` should print the sum of the numbers in {data}, but it fails. "
            f"Fix {script} (current directory) so that it does."
        ),
        "files": {script: body, data: "\n".join(map(str, numbers)) + "\n"},
        "collect": [script],
        "expect": {"script": script, "data": {data: "\n".join(map(str, numbers)) + "\n"}, "value": str(sum(numbers))},
        "solution": f'sed -i \'s/{bad}(/{good}(/; s/"{bad}"/"{good}"/\' {script}',
        "bug": what,
    }


#: kind name -> its maker
KINDS: dict[str, Callable[[np.random.Generator], dict]] = {
    "write_file": _write_file,
    "set_config": _set_config,
    "count_lines": _count_lines,
    "fix_script": _fix_script,
}


def _is_eval(task: dict) -> bool:
    key = task["prompt"] + json.dumps(task["files"], sort_keys=True)
    return int(hashlib.blake2b(key.encode(), digest_size=8).hexdigest(), 16) % _EVAL_BUCKETS == 0


def check_kinds(kinds: Sequence[str] | None) -> tuple[str, ...]:
    """``kinds`` as a tuple of known kind names (None: all); ValueError naming an unknown one."""
    if kinds is None:
        return tuple(KINDS)
    out = tuple(kinds)
    unknown = [k for k in out if k not in KINDS]
    if not out or unknown:
        raise ValueError(f"kinds must be a non-empty list of {list(KINDS)}, got {list(out)!r}")
    return out


def generate_task(seed: int, split: str = "train", kinds: Sequence[str] | None = None) -> dict:
    """The task for ``seed`` in ``split`` drawn from ``kinds`` (None: all); a pure function of its arguments."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    names = check_kinds(kinds)
    rng = np.random.default_rng([int(seed) & (2**63 - 1), SPLITS.index(split), 0xBA5])
    for _ in range(_MAX_REDRAWS):
        task = KINDS[names[_i(rng, 0, len(names) - 1)]](rng)
        if _is_eval(task) == (split == "eval"):
            break
    else:  # unreachable: every kind has far more than 1000 tasks per split
        raise RuntimeError(f"could not draw a {split} task of kinds {names}")
    digest = hashlib.blake2b((task["prompt"] + json.dumps(task["files"], sort_keys=True)).encode(), digest_size=6)
    return {"id": f"bash-{split}-{digest.hexdigest()}", **task}


def sample_task(rng: np.random.Generator, split: str = "train", kinds: Sequence[str] | None = None) -> dict:
    """A task drawn with ``rng`` (e.g. an env's ``np_random``)."""
    return generate_task(int(rng.integers(2**63 - 1)), split, kinds)


def eval_tasks(n: int, *, seed: int = 0, kinds: Sequence[str] | None = None) -> list[dict]:
    """``n`` distinct held-out tasks, fixed by ``seed``."""
    return distinct_tasks(lambda s: generate_task(s, "eval", kinds), n, seed=seed)


#: The check, run in a fresh sandbox holding the collected files (see the module docstring).
CHECK_PROGRAM = r"""
import configparser, json, os, subprocess, sys
spec = json.loads(sys.stdin.readline())
kind, expect = spec["kind"], spec["expect"]


def read(name):
    if not os.path.isfile(name):
        return None
    with open(name, encoding="utf-8", errors="replace") as f:
        return f.read()


def check():
    if kind in ("write_file", "count_lines"):
        text = read(expect["file"])
        if text is None:
            return False, f"{expect['file']} does not exist"
        if text.strip() != expect["value"]:
            return False, f"{expect['file']} holds {text.strip()[:80]!r}, not {expect['value']!r}"
        return True, f"{expect['file']} holds {expect['value']!r}"
    if kind == "set_config":
        text = read(expect["file"])
        if text is None:
            return False, f"{expect['file']} is gone"
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error as e:
            return False, f"{expect['file']} no longer parses: {str(e)[:120]}"
        want = {s: dict(kv) for s, kv in expect["config"].items()}
        want[expect["section"]][expect["key"]] = expect["value"]
        for section, kv in want.items():
            for key, value in kv.items():
                got = parser.get(section, key, fallback=None)
                if got != value:
                    return False, f"[{section}] {key} is {got!r}, expected {value!r}"
        return True, f"[{expect['section']}] {expect['key']} = {expect['value']}, the rest unchanged"
    if kind == "fix_script":
        if read(expect["script"]) is None:
            return False, f"{expect['script']} is gone"
        for name, text in expect["data"].items():
            with open(name, "w", encoding="utf-8") as f:
                f.write(text)
        try:
            run = subprocess.run(
                [sys.executable, expect["script"]], stdin=subprocess.DEVNULL, capture_output=True, timeout=5, text=True
            )
        except subprocess.TimeoutExpired:
            return False, f"python3 {expect['script']} ran past 5 s"
        if run.returncode != 0:
            return False, f"python3 {expect['script']} exited {run.returncode}: {run.stderr.strip()[-160:]!r}"
        if run.stdout.strip() != expect["value"]:
            return False, f"python3 {expect['script']} printed {run.stdout.strip()[:80]!r}, not {expect['value']!r}"
        return True, f"python3 {expect['script']} prints {expect['value']}"
    return False, f"unknown task kind {kind!r}"


ok, reason = check()
sys.stdout.write(spec["nonce"] + json.dumps({"ok": ok, "reason": reason}) + "\n")
sys.stdout.flush()
"""
