"""Resume that falls back (issue 20): ``--resume`` verifies the newest checkpoint (marker, sizes, sha256
of every file, written with it) and falls back to the newest one that verifies, saying which it skipped
and why, with the ledger still exactly once; a save that runs out of disk says so, removes its partial
``.tmp`` and leaves the previous checkpoint usable. Issue 31: a checkpoint whose files are gone (its
manifest with them, only the marker left) is skipped the same way, naming the first missing file."""

import asyncio
import json
import os
import shutil
import subprocess
import uuid

import components
import pytest
from typer.testing import CliRunner

from agentrl.cli.main import app
from agentrl.config.schema import load_config
from agentrl.errors import CheckpointError
from agentrl.jobs.crash_harness import ledger_check, small_run_cmd
from agentrl.jobs.run import Runner
from agentrl.trainer.integrity import (
    MANIFEST,
    MARKER,
    failed_save_cleanup,
    layout_gap,
    pick_resume,
    verify,
    write_manifest,
)


def _fake_ckpt(d, payload=b"x" * 1000, world=1, lora=0, critic=False, manifest=True):
    """A checkpoint with the files ``checkpoint.load`` reads (contents are stand-ins)."""
    state = {"version": 1, "world_size": world, "lora_rank": lora, "critic": critic, "extra": {}}
    weights = ["adapter/adapter_config.json", "adapter/adapter_model.safetensors"] if lora else ["model.safetensors"]
    states = ["optimizer.pt", "scheduler.pt", *(f"rng/rank{r}.pt" for r in range(world))]
    if critic:
        states += ["critic/critic.safetensors", "critic/optimizer.pt", "critic/scheduler.pt"]
    files = {"trainer_state.json": json.dumps(state).encode(), **dict.fromkeys(weights, payload)}
    files.update(dict.fromkeys(states, b"state"))
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    if manifest:
        write_manifest(d)
    (d / MARKER).write_text("ok\n")
    return d


def _only_marker_left(d):
    for f in sorted(d.rglob("*"), reverse=True):  # files before their folders
        if f.name != MARKER:
            f.unlink() if f.is_file() else f.rmdir()


def _truncate(d):
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _flip(d, name="model.safetensors"):
    f = d / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    f.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated_weights": (_truncate, "model.safetensors is"),
    "missing_marker": (lambda d: (d / MARKER).unlink(), "no COMPLETE marker"),
    "flipped_bytes": (_flip, "sha256"),
    "missing_file": (lambda d: (d / "rng" / "rank0.pt").unlink(), "rng/rank0.pt is missing"),
    "bad_manifest": (lambda d: (d / MANIFEST).write_text("{"), "MANIFEST.json is unreadable"),
    "only_marker_left": (_only_marker_left, "trainer_state.json is missing"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_verify_names_each_corruption_and_pick_resume_falls_back(tmp_path, kind):
    corrupt, reason = CORRUPTIONS[kind]
    ckpts = tmp_path / "checkpoints"
    for n in (1, 2, 3):
        _fake_ckpt(ckpts / f"step_{n:06d}")
    (ckpts / "step_000004.tmp").mkdir()  # a save in progress is never a candidate
    assert verify(ckpts / "step_000003") is None
    corrupt(ckpts / "step_000003")
    assert reason in verify(ckpts / "step_000003")
    notes = []
    assert pick_resume(ckpts, note=notes.append) == ckpts / "step_000002"
    assert len(notes) == 1 and "step_000003" in notes[0] and reason in notes[0]


@pytest.mark.parametrize(
    ("layout", "lost", "reason"),
    [
        ({}, "trainer_state.json", "trainer_state.json is missing"),
        ({}, "optimizer.pt", "optimizer.pt is missing"),
        ({}, "model.safetensors", "model.safetensors is missing"),
        ({"world": 2}, "rng/rank1.pt", "rng/rank1.pt is missing"),
        ({"lora": 8}, "adapter/adapter_model.safetensors", "adapter/adapter_model.safetensors is missing"),
        ({"critic": True}, "critic/scheduler.pt", "critic/scheduler.pt is missing"),
    ],
)
def test_a_checkpoint_without_manifest_is_checked_by_its_layout(tmp_path, layout, lost, reason):
    """Without a manifest (older checkpoints, or it was deleted with the rest) the marker alone does not
    make a checkpoint usable: every file loading needs, as its trainer_state.json describes it."""
    ckpts = tmp_path / "checkpoints"
    _fake_ckpt(ckpts / "step_000001", manifest=False, **layout)
    newest = _fake_ckpt(ckpts / "step_000002", manifest=False, **layout)
    assert verify(newest) is None and layout_gap(newest) is None
    (newest / lost).unlink()
    assert verify(newest) == reason
    notes = []
    assert pick_resume(ckpts, note=notes.append) == ckpts / "step_000001"
    assert notes == [f"--resume: skipped checkpoint {newest}: {reason}"]


def test_a_lost_manifest_and_a_broken_state_are_named(tmp_path):
    d = _fake_ckpt(tmp_path / "step_000001")
    (d / "trainer_state.json").write_text("{")  # the manifest's sizes catch it first
    assert "trainer_state.json is" in verify(d)
    (d / MANIFEST).unlink()
    assert verify(d).startswith("trainer_state.json is unreadable (")
    (d / "trainer_state.json").write_text(json.dumps({"world_size": 1}))  # an older state: no critic flag
    (d / "critic").mkdir()  # ... so a critic/ folder says it had one
    assert verify(d) == "critic/critic.safetensors is missing"


def test_pick_resume_with_every_checkpoint_broken_is_an_error_not_a_fresh_start(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for n in (1, 2):
        _truncate(_fake_ckpt(ckpts / f"step_{n:06d}"))
    with pytest.raises(CheckpointError, match="no usable checkpoint.*step_000002.*step_000001"):
        pick_resume(ckpts, note=lambda m: None)
    assert pick_resume(tmp_path / "none") is None  # no checkpoint at all: a fresh start


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4416 vs 4310"),
        OSError(28, "No space left on device"),
        RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"),
    ],
)
def test_a_full_disk_is_reported_as_such_and_the_partial_save_removed(tmp_path, error):
    prev = _fake_ckpt(tmp_path / "step_000001")
    tmp = tmp_path / "step_000002.tmp"
    with pytest.raises(CheckpointError, match="no space left on device while writing checkpoint .*step_000002"):
        with failed_save_cleanup(tmp, tmp_path / "step_000002"):
            tmp.mkdir()
            (tmp / "half").write_bytes(b"x")
            raise error
    assert not tmp.exists() and verify(prev) is None
    with pytest.raises(ValueError, match="other"):  # any other failure: still cleaned, raised as it was
        with failed_save_cleanup(tmp, tmp_path / "step_000002"):
            tmp.mkdir()
            raise ValueError("other")
    assert not tmp.exists()


# -- whole runs --------------------------------------------------------------------------------------
def _argv(model_dir, out, steps, *extra):
    return small_run_cmd(model_dir, out, steps, *extra)[3:]  # drop "python -m agentrl"


def _cfg(model_dir, out, steps, *extra):
    argv = _argv(model_dir, out, steps, *extra)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return load_config([], [f"output_dir={out}", "env.id=concise", "algo.name=grpo", f"train.steps={steps}", *sets])


def _run(model_dir, out, steps, *extra):
    return asyncio.run(Runner(_cfg(model_dir, out, steps, *extra), progress=False).run())


@pytest.fixture(scope="module")
def three_steps(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("base") / "run"
    _run(tiny_model_dir, out, 3)
    return out


@pytest.mark.parametrize("kind", ["truncated_weights", "missing_marker", "flipped_bytes", "only_marker_left"])
def test_resume_skips_a_corrupted_newest_checkpoint_and_the_ledger_stays_exactly_once(
    three_steps, tiny_model_dir, tmp_path, capsys, kind
):
    out = tmp_path / "run"
    shutil.copytree(three_steps, out)
    corrupt, reason = CORRUPTIONS[kind]
    corrupt(out / "checkpoints" / "step_000003")
    runner = Runner(_cfg(tiny_model_dir, out, 4, "train.resume=true"), progress=False)
    summary = asyncio.run(runner.run())
    err = capsys.readouterr().err
    assert "skipped checkpoint" in err and "step_000003" in err and reason in err, err
    assert any("resumed from" in w and w.endswith("step_000002 at step 2") for w in runner.warnings), runner.warnings
    assert summary["steps"] == 4
    chk = ledger_check(out)
    assert chk["steps"] == [1, 2, 3, 4], chk
    assert chk["duplicates"] == [] and chk["lost"] == [], chk
    assert verify(out / "checkpoints" / "step_000003") is None  # re-saved by the resumed run


def _mount_tmpfs(path, size):
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", f"agentrl-test-{uuid.uuid4().hex[:6]}", str(path)],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        components.unavailable("root", f"cannot mount a tmpfs here ({getattr(e, 'stderr', '') or e}); needs root")


def test_a_full_disk_during_a_checkpoint_is_a_clear_error_and_the_previous_checkpoint_survives(
    tiny_model_dir, tmp_path
):
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "64m")
    try:
        out = mnt / "run"
        res = CliRunner().invoke(app, _argv(tiny_model_dir, out, 1))
        assert res.exit_code == 0, res.output
        first = out / "checkpoints" / "step_000001"
        size = sum(f.stat().st_size for f in first.rglob("*") if f.is_file())
        free = shutil.disk_usage(mnt).free
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # leave room for the logs of a step, not for another checkpoint
            f.truncate(max(free - size // 2, 0))
            os.posix_fallocate(f.fileno(), 0, max(free - size // 2, 0))
        res = CliRunner().invoke(app, _argv(tiny_model_dir, out, 2) + ["--resume"])
        assert res.exit_code == 2, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "no space left on device while writing checkpoint" in errors[0], res.output
        assert "step_000002" in errors[0] and "Traceback" not in res.output
        assert verify(first) is None, "the previous checkpoint must stay usable"
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]  # no .tmp left
        filler.unlink()
        res = CliRunner().invoke(app, _argv(tiny_model_dir, out, 2) + ["--resume"])
        assert res.exit_code == 0, res.output
        chk = ledger_check(out)
        assert chk["steps"] == [1, 2] and chk["duplicates"] == [] and chk["lost"] == [], chk
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
