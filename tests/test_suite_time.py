"""tools/suite_time.py: the tables CI prints of where the suite's time went, on a hand-made run."""

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "suite_time", Path(__file__).resolve().parents[1] / "tools" / "suite_time.py"
)
suite_time = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(suite_time)


def _phase(test, when, s, worker, marks=(), outcome="passed"):
    return {"test": test, "when": when, "s": s, "outcome": outcome, "worker": worker, "marks": list(marks)}


def test_totals_per_worker_folder_marker_and_the_slowest():
    data = {
        "wall_s": 600.0,
        "phases": [
            _phase("tests/engine/test_a.py::t1", "setup", 50.0, "gw0", ["sglang"]),  # the session server's start
            _phase("tests/engine/test_a.py::t1", "call", 10.0, "gw0", ["sglang"]),
            _phase("tests/engine/test_a.py::t2", "call", 30.0, "gw0", ["sglang"]),
            _phase("tests/jobs/test_b.py::t3", "call", 120.0, "gw1", ["slow"]),
            _phase("tests/test_c.py::t4", "call", 30.0, "gw1"),
        ],
    }
    out = suite_time.summarize(data, top=2)
    assert out.splitlines()[0] == ("wall 10.0 min; test time 4.0 min over 4 tests; gw0 busy 1.5 min, gw1 busy 2.5 min")
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.startswith(("tests/", "sglang", "slow"))}
    assert rows["tests/engine"] == ["2", "1.5", "38%"] and rows["tests/jobs"] == ["1", "2.0", "50%"]
    assert rows["tests/test_c.py"] == ["1", "0.5", "12%"]
    assert rows["sglang"] == ["2", "1.5", "38%"] and rows["slow"] == ["1", "2.0", "50%"]
    slowest = out.split("slowest tests")[1].splitlines()[1:]
    assert [ln.split()[:2] for ln in slowest] == [
        ["tests/jobs/test_b.py::t3", "120"],
        ["tests/engine/test_a.py::t1", "60"],
    ]
