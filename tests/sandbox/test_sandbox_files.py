"""agentrl.sandbox.files: names, copy-in through planted links, copy-out refusals, caps, tar variants."""

from __future__ import annotations

import io
import os
import tarfile
import threading

import components
import pytest

from agentrl.sandbox.files import check_relpath, collect_files, collect_from_tar, files_to_tar, write_files

CAPS = dict(max_file_bytes=1000, max_total_bytes=1500)


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../../b", "a/..", ".", "a\x00b"])
def test_bad_names(name):
    with pytest.raises(ValueError):
        check_relpath(name)


@pytest.mark.parametrize("name", ["a", "a/b/c.txt", "./a", "a//b", ".hidden"])
def test_good_names(name):
    assert not check_relpath(name).is_absolute()


def test_write_and_collect_roundtrip(tmp_path):
    write_files(str(tmp_path), {"a.txt": b"A", "d/e/f.bin": b"\x00\xff"})
    got = collect_files(str(tmp_path), ["a.txt", "d/e/f.bin", "./a.txt"], **CAPS)
    assert got.files == {"a.txt": b"A", "d/e/f.bin": b"\x00\xff", "./a.txt": b"A"} and not got.refused


def test_write_replaces_planted_symlinks_instead_of_following_them(tmp_path):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "target").write_bytes(b"host file")
    os.symlink(outside / "target", work / "f.txt")  # a file that is a link to a host file
    os.symlink(outside, work / "d")  # a dir that is a link to a host dir
    write_files(str(work), {"f.txt": b"new", "d/g.txt": b"new"})
    assert (outside / "target").read_bytes() == b"host file" and sorted(os.listdir(outside)) == ["target"]
    assert (work / "f.txt").read_bytes() == b"new" and not (work / "f.txt").is_symlink()
    assert (work / "d").is_dir() and not (work / "d").is_symlink() and (work / "d/g.txt").read_bytes() == b"new"


def test_write_caps_and_directory_in_the_way(tmp_path):
    with pytest.raises(ValueError, match="cap"):
        write_files(str(tmp_path), {"a": b"x" * 10, "b": b"y" * 10}, max_total_bytes=15)
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError, match="directory is in the way"):
        write_files(str(tmp_path), {"dir": b"x"})
    with pytest.raises(TypeError):
        write_files(str(tmp_path), {"s": "text"})  # type: ignore[dict-item]


@pytest.mark.skipif(os.geteuid() != 0, reason=components.reason("root", "chown to another uid needs root"))
def test_write_gives_files_to_the_sandbox_user(tmp_path):
    write_files(str(tmp_path), {"d/x": b"1"}, owner=(1234, 1234))
    assert (tmp_path / "d").stat().st_uid == 1234 and (tmp_path / "d/x").stat().st_uid == 1234


def test_collect_refuses_escapes(tmp_path):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"s3cret")
    (work / "real.txt").write_bytes(b"ok")
    (work / "sub").mkdir()
    os.symlink("/etc/passwd", work / "abs")  # absolute target
    os.symlink("../outside/secret", work / "rel_out")  # relative target leaving the dir
    os.symlink(outside, work / "dirlink")  # a directory link out
    os.symlink("real.txt", work / "inside")  # stays inside: allowed
    os.symlink("../real.txt", work / "sub/up_inside")  # .. but still inside: allowed
    os.symlink("loop2", work / "loop1")
    os.symlink("loop1", work / "loop2")
    os.link(outside / "secret", work / "hard")  # a hard link to a host file
    os.mkfifo(work / "fifo")  # would block an open() for ever
    (work / "big").write_bytes(b"x" * 1001)
    names = [
        "real.txt",
        "abs",
        "rel_out",
        "dirlink/secret",
        "inside",
        "sub/up_inside",
        "loop1",
        "hard",
        "fifo",
        "big",
        "missing",
        "sub",
        "../outside/secret",
        "/etc/passwd",
    ]
    got = collect_files(str(work), names, **CAPS)
    assert got.files == {"real.txt": b"ok", "inside": b"ok", "sub/up_inside": b"ok"}
    assert set(got.refused) == set(names) - set(got.files)
    assert "outside" in got.refused["abs"] and "outside" in got.refused["rel_out"]
    assert "symlink" in got.refused["loop1"] and "hard link" in got.refused["hard"]
    assert "regular" in got.refused["fifo"] and "cap" in got.refused["big"] and "no such" in got.refused["missing"]
    assert "not collected" in got.detail() and "'abs'" in got.detail()


def test_collect_total_cap(tmp_path):
    for n in "abc":
        (tmp_path / n).write_bytes(b"x" * 600)
    got = collect_files(str(tmp_path), ["a", "b", "c"], **CAPS)
    assert list(got.files) == ["a", "b"] or list(got.files) == ["a"]
    assert "total cap" in got.refused["c"]


def test_collect_does_not_block_on_a_fifo_with_a_writer_gone(tmp_path):
    os.mkfifo(tmp_path / "f")
    done = threading.Event()

    def go():
        collect_files(str(tmp_path), ["f"], **CAPS)
        done.set()

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(5)


def test_tar_roundtrip_and_refusals():
    blob = files_to_tar({"a.txt": b"A", "d/b": b"B"}, uid=1000, gid=1000)
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        assert [(m.name, m.uid, m.isfile()) for m in t] == [("a.txt", 1000, True), ("d/b", 1000, True)]
    with pytest.raises(ValueError):
        files_to_tar({"../x": b""})

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, kind, data in [
            ("ok", tarfile.REGTYPE, b"fine"),
            ("sym", tarfile.SYMTYPE, b""),
            ("hard", tarfile.LNKTYPE, b""),
            ("big", tarfile.REGTYPE, b"x" * 1001),
            ("dev", tarfile.CHRTYPE, b""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, len(data)
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = "/etc/shadow"
            t.addfile(info, io.BytesIO(data) if data else None)
    buf.seek(0)
    wanted = {n: n for n in ["ok", "sym", "hard", "big", "dev", "absent"]}
    got = collect_from_tar(buf, wanted, **CAPS)
    assert got.files == {"ok": b"fine"}
    assert set(got.refused) == {"sym", "hard", "big", "dev", "absent"}
    assert collect_from_tar(io.BytesIO(b"not a tar"), {"x": "x"}, **CAPS).refused["x"].startswith("unreadable")
