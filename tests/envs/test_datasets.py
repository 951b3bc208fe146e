"""Dataset loader: JSONL/JSON/parquet, veRL layout, bad-row policy, and CodeExecEnv on a file."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentrl.envs.datasets import load_tasks
from agentrl.errors import DatasetError


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _verl_parquet(path, n=3):
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {
                    "role": "user",
                    "content": f"What is {i} + {i}? Let's think step by step and output the final "
                    f'answer after "####".',
                }
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i, "answer": f"{i}+{i}={2 * i} #### {2 * i}", "question": "q"},
        }
        for i in range(n)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_plain_jsonl(tmp_path):
    p = _jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"prompt": "What is 2+2?", "answer": 4},
            "",  # blank lines are fine
            {
                "prompt": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "3*3?"}],
                "answer": "9",
                "id": "sq",
            },
        ],
    )
    ds = load_tasks(p)
    assert len(ds) == 2 and ds.skipped == 0
    assert ds[0] == {
        "id": "tasks-0",
        "prompt": "What is 2+2?",
        "answer": "4",
        "difficulty": None,
        "kind": "dataset",
        "data_source": "tasks",
        "extra_info": {},
    }
    assert ds[1]["id"] == "sq" and ds[1]["prompt"][1] == {"role": "user", "content": "3*3?"}
    json.dumps(list(ds))  # JSON-able


def test_verl_parquet_layout(tmp_path):
    ds = load_tasks(_verl_parquet(tmp_path / "train.parquet"))
    assert len(ds) == 3
    t = ds[2]
    assert t["answer"] == "4" and t["data_source"] == "openai/gsm8k" and t["id"] == "2"
    assert t["prompt"][0]["role"] == "user" and "####" in t["prompt"][0]["content"]
    assert t["extra_info"]["answer"].endswith("#### 4")


def test_json_list_and_unit_test_rows(tmp_path):
    p = tmp_path / "fns.json"
    p.write_text(json.dumps([{"prompt": "write f", "tests": ["assert f(1) == 2"], "entry_point": "f"}]))
    t = load_tasks(p)[0]
    assert t["tests"] == ["assert f(1) == 2"] and t["entry_point"] == "f" and t["answer"] is None


@pytest.mark.parametrize(
    "row, why",
    [
        ({"answer": "1"}, "missing 'prompt'"),
        ({"prompt": "", "answer": "1"}, "'prompt' is empty"),
        ({"prompt": "q"}, "missing 'answer'"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "prompt message 0"),
        ({"prompt": [{"role": "wizard", "content": "x"}], "answer": "1"}, "unknown role 'wizard'"),
        ({"prompt": [{"role": "system", "content": "x"}], "answer": "1"}, "no 'user' message"),
        ({"prompt": "q", "answer": {"a": 1}}, "answer must be a string or a number"),
        ({"prompt": "q", "reward_model": {"style": "model", "ground_truth": "1"}}, "style 'model' is not supported"),
        ({"prompt": "q", "tests": ["assert 1"]}, "needs an 'entry_point'"),
        ([1, 2], "row must be an object"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, row, why):
    p = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok", "answer": "1"}, row])
    with pytest.raises(DatasetError) as e:
        load_tasks(p)
    assert str(p) in str(e.value) and "line 2" in str(e.value) and why in str(e.value)


def test_invalid_json_line(tmp_path):
    p = _jsonl(tmp_path / "broken.jsonl", [{"prompt": "ok", "answer": "1"}, '{"prompt": "x", '])
    with pytest.raises(DatasetError, match=r"broken\.jsonl: line 2: invalid JSON"):
        load_tasks(p)


def test_skip_policy_counts(tmp_path):
    p = _jsonl(
        tmp_path / "mixed.jsonl",
        [{"prompt": "a", "answer": 1}, {"prompt": "b"}, "not json", {"prompt": "c", "answer": 3}],
    )
    ds = load_tasks(p, on_bad_row="skip")
    assert [t["prompt"] for t in ds] == ["a", "c"] and ds.skipped == 2
    assert ds.skip_reasons[0].startswith("line 2")


def test_parquet_bad_row_names_row(tmp_path):
    p = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "answer": "1"}, {"prompt": None, "answer": "2"}]), p)
    with pytest.raises(DatasetError, match=r"bad\.parquet: row 1: missing 'prompt'"):
        load_tasks(p)


def test_file_level_errors(tmp_path):
    with pytest.raises(DatasetError, match="cannot open"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        load_tasks(tmp_path / "x.csv")
    empty = _jsonl(tmp_path / "empty.jsonl", [{"prompt": "b"}])
    with pytest.raises(DatasetError, match="no usable rows"):
        load_tasks(empty, on_bad_row="skip")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="cannot read parquet"):
        load_tasks(tmp_path / "junk.parquet")
    with pytest.raises(DatasetError, match="on_bad_row"):
        load_tasks(empty, on_bad_row="ignore")


def test_cached_until_file_changes(tmp_path):
    p = _jsonl(tmp_path / "c.jsonl", [{"prompt": "a", "answer": 1}])
    assert load_tasks(p) is load_tasks(p)
    _jsonl(p, [{"prompt": "a", "answer": 1}, {"prompt": "bb", "answer": 2}])
    assert len(load_tasks(p)) == 2


def test_limit(tmp_path):
    p = _jsonl(tmp_path / "l.jsonl", [{"prompt": str(i), "answer": i} for i in range(10)])
    assert len(load_tasks(p, limit=3)) == 3


def test_code_exec_env_on_verl_parquet(tmp_path):
    from agentrl.envs.registry import make

    env = make("code_exec", dataset=str(_verl_parquet(tmp_path / "train.parquet")))
    try:
        obs, info = env.reset(seed=0)
        task = info["task"]
        assert info["messages"][0]["role"] == "system" and info["messages"][1] == task["prompt"][0]
        assert obs.endswith(task["prompt"][0]["content"])
        _, info2 = env.reset(seed=0, options={"index": 1})
        assert info2["task"]["answer"] == "2"
        _, r, term, _, _ = env.step("so the sum is\n#### 2")
        assert term and r == 1.0
        env.reset(seed=0, options={"index": 1})
        assert env.step("#### 3")[1] == 0.0
    finally:
        env.close()
