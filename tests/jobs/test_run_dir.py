"""The run-directory rule (agentrl.jobs.run_dir): a directory holding a run is never silently reused."""

import pytest

from agentrl.errors import ConfigError
from agentrl.jobs.run_dir import RUN_MARKERS, prepare_run_dir, run_markers, set_aside_path


def test_missing_empty_and_unrelated_directories_hold_no_run(tmp_path):
    assert run_markers(tmp_path / "missing") == []
    assert run_markers(tmp_path) == []
    (tmp_path / "notes.txt").write_text("mine")
    assert prepare_run_dir(tmp_path, resume=False, overwrite=False) is None
    assert (tmp_path / "notes.txt").exists()


@pytest.mark.parametrize("marker", RUN_MARKERS)
def test_each_marker_means_a_run_and_is_refused_naming_the_way_out(tmp_path, marker):
    d = tmp_path / "run"
    d.mkdir()
    (d / marker).mkdir() if marker == "checkpoints" else (d / marker).write_text("x")
    assert run_markers(d) == [marker]
    with pytest.raises(ConfigError) as e:
        prepare_run_dir(d, resume=False, overwrite=False)
    msg = str(e.value)
    assert str(d) in msg and marker in msg and "--resume" in msg and "--overwrite" in msg and "run.old-1" in msg
    assert (d / marker).exists()  # nothing touched


def test_resume_uses_the_run_as_it_is(tmp_path):
    (tmp_path / "config.yaml").write_text("x")
    assert prepare_run_dir(tmp_path, resume=True, overwrite=False) is None
    assert (tmp_path / "config.yaml").read_text() == "x"


def test_overwrite_moves_the_run_aside_to_the_first_free_name(tmp_path):
    d = tmp_path / "run"
    for n in (1, 2):
        d.mkdir()
        (d / "metrics.jsonl").write_text(str(n))
        moved = prepare_run_dir(d, resume=False, overwrite=True)
        assert moved == tmp_path / f"run.old-{n}" and (moved / "metrics.jsonl").read_text() == str(n)
        assert not d.exists()
    assert set_aside_path(d) == tmp_path / "run.old-3"
    assert prepare_run_dir(d, resume=False, overwrite=True) is None  # nothing there: nothing moved


def test_contradictions_and_files_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="contradict"):
        prepare_run_dir(tmp_path, resume=True, overwrite=True)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        prepare_run_dir(f, resume=False, overwrite=False)
