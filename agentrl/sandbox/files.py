"""Copying files into and out of a sandbox work dir without letting the program reach the host.

Owns: the file-name rule (``check_relpath``), writing caller files into a work dir on the host
(``write_files``), copying named files out of one (``collect_files``), and the same two
directions as tar archives for backends that move files as tar streams (docker's put_archive /
get_archive: ``files_to_tar``, ``collect_from_tar``).

The threat: the program owns the work dir. Between two turns of a session, or before files are
collected, it can plant symlinks (``out.txt -> /etc/shadow``, ``d -> /``), hard links, FIFOs (an
``open`` for reading would block for ever) or huge files. The trainer usually runs as root, so
following any of them would read or write host files with root's rights. Therefore:

* names are relative POSIX paths with no ``..``, no empty or NUL parts, never absolute;
* every directory on the way is opened with ``O_NOFOLLOW`` relative to the previous one
  (``openat`` walking), so a symlinked directory is never followed; the final file is opened with
  ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file with one link;
* copying out, a symlink whose target stays inside the work dir is followed (resolved by hand,
  with the same checks); one that leaves it is refused;
* sizes are capped per file and in total, read with a bound (a file that grows is cut off).

Refusals when collecting are reported, not raised: the program controls what is there. Writing in
replaces whatever non-directory the program left in the way (the caller's files win).

Does not: decide limits (the caller passes them) or know about any backend.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SYMLINK_HOPS = 16


def check_relpath(name: str) -> PurePosixPath:
    """``name`` as a relative path inside the work dir, or ValueError (absolute, ``..``, empty, NUL)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"sandbox file name must be a non-empty str without NUL, got {name!r}")
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts == (".",):
        raise ValueError(f"sandbox file name must be a relative path without '..', got {name!r}")
    return p


@dataclass
class Collected:
    """What ``collect_files`` copied out, and what it refused with why (``{path: reason}``)."""

    files: dict[str, bytes] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def detail(self) -> str:
        """One line naming the refused paths, for ``ExecResult.detail`` ("" when none)."""
        if not self.refused:
            return ""
        return "not collected: " + "; ".join(f"{p!r} ({why})" for p, why in self.refused.items())


# ------------------------------------------------------------------------------------------ in
def write_files(
    root: str, files: Mapping[str, bytes], *, owner: tuple[int, int] | None = None, max_total_bytes: int | None = None
) -> None:
    """Write ``files`` under the directory ``root``, creating parent dirs; ``owner`` (uid, gid) is
    given to what is created (the sandbox user must be able to overwrite it). ValueError for a bad
    name, a total over ``max_total_bytes``, or a directory in the way of a file."""
    checked = [(check_relpath(k), v) for k, v in files.items()]
    total = sum(len(v) for _, v in checked)
    if max_total_bytes is not None and total > max_total_bytes:
        raise ValueError(f"files to copy in total {total} bytes, over the {max_total_bytes}-byte cap")
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for rel, data in checked:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"content of sandbox file {str(rel)!r} must be bytes, got {type(data).__name__}")
            parent = _walk_dirs(root_fd, rel.parts[:-1], create=True, owner=owner)
            try:
                _replace_file(parent, rel.parts[-1], bytes(data), owner, str(rel))
            finally:
                os.close(parent)
    finally:
        os.close(root_fd)


def _walk_dirs(root_fd: int, parts: Iterable[str], *, create: bool, owner: tuple[int, int] | None) -> int:
    """An fd of root/parts..., never following a symlink. With ``create``, a missing dir is made and
    a non-directory in the way is removed (the program put it there)."""
    fd = os.dup(root_fd)
    for part in parts:
        if part == ".":
            continue
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            if not create or e.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                os.close(fd)
                raise
            if e.errno != errno.ENOENT:
                os.unlink(part, dir_fd=fd)  # a symlink or file where we need a directory
            os.mkdir(part, 0o755, dir_fd=fd)
            if owner is not None:
                os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def _replace_file(dir_fd: int, name: str, data: bytes, owner: tuple[int, int] | None, shown: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"cannot write sandbox file {shown!r}: a directory is in the way")
        os.unlink(name, dir_fd=dir_fd)  # never write through a link the program planted
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    try:
        if owner is not None:
            os.fchown(fd, *owner)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------- out
def collect_files(root: str, paths: Iterable[str], *, max_file_bytes: int, max_total_bytes: int) -> Collected:
    """Copy the regular files named by ``paths`` (relative to ``root``) out; see the module docstring
    for what is refused. Never raises for what the program left in the work dir."""
    out = Collected()
    total = 0
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for name in paths:
            try:
                rel = check_relpath(name)
            except ValueError as e:
                out.refused[str(name)] = str(e).split(", got")[0]
                continue
            try:
                data = _read_inside(root_fd, rel, max_file_bytes)
            except _Refused as e:
                out.refused[name] = str(e)
                continue
            if total + len(data) > max_total_bytes:
                out.refused[name] = f"over the {max_total_bytes}-byte total cap"
                continue
            total += len(data)
            out.files[name] = data
    finally:
        os.close(root_fd)
    return out


class _Refused(Exception):
    pass


def _resolve_inside(root_fd: int, rel: PurePosixPath) -> list[str]:
    """Resolve symlinks by hand, keeping the path inside root: the final list of components."""
    todo = list(rel.parts)
    done: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise _Refused("a symlink leads outside the work dir")
            done.pop()
            continue
        parent = _open_components(root_fd, done)
        try:
            st = os.stat(part, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_SYMLINK_HOPS:
                    raise _Refused("too many symlinks")
                target = os.readlink(part, dir_fd=parent)
                if posixpath.isabs(target):
                    raise _Refused(f"a symlink points outside the work dir ({target!r})")
                todo = list(PurePosixPath(target).parts) + todo
                continue
        except FileNotFoundError:
            raise _Refused("no such file") from None
        finally:
            os.close(parent)
        done.append(part)
    if not done:
        raise _Refused("not a regular file")
    return done


def _open_components(root_fd: int, parts: list[str]) -> int:
    try:
        return _walk_dirs(root_fd, parts, create=False, owner=None)
    except OSError as e:
        raise _Refused(f"cannot open a parent directory: {os.strerror(e.errno or 0)}") from None


def _read_inside(root_fd: int, rel: PurePosixPath, cap: int) -> bytes:
    parts = _resolve_inside(root_fd, rel)
    parent = _open_components(root_fd, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as e:
            raise _Refused(f"cannot open: {os.strerror(e.errno or 0)}") from None
    finally:
        os.close(parent)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("not a regular file")
        if st.st_nlink != 1:
            raise _Refused("a hard link (may alias a file outside the work dir)")
        if st.st_size > cap:
            raise _Refused(f"{st.st_size} bytes, over the {cap}-byte cap")
        chunks, got = [], 0
        while got <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > cap:
            raise _Refused(f"grew over the {cap}-byte cap while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------- tar
def files_to_tar(files: Mapping[str, bytes], *, uid: int = 0, gid: int = 0, mtime: float = 0.0) -> bytes:
    """A tar archive of ``files`` (names checked), regular files only, owned by ``uid``/``gid``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            rel = check_relpath(name)
            info = tarfile.TarInfo(str(rel))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, uid, gid, mtime
            tar.addfile(info, io.BytesIO(bytes(data)))
    return buf.getvalue()


def collect_from_tar(fileobj, wanted: Mapping[str, str], *, max_file_bytes: int, max_total_bytes: int) -> Collected:
    """Pick ``wanted`` ({member name in the archive: path to report}) out of a tar stream, refusing
    symlinks, hard links, devices, absolute or ``..`` member names, and files over the caps.
    The archive is read as a stream (``r|*``): nothing is extracted to disk."""
    out = Collected()
    total = 0
    pending = dict(wanted)
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as tar:
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name
                report = pending.pop(name, None)
                if report is None:
                    continue
                if member.name.startswith("/") or ".." in PurePosixPath(member.name).parts:
                    out.refused[report] = "archive member leaves the work dir"
                elif member.issym() or member.islnk():
                    out.refused[report] = "a link (symlinks and hard links are not followed in archives)"
                elif not member.isfile():
                    out.refused[report] = "not a regular file"
                elif member.size > max_file_bytes:
                    out.refused[report] = f"{member.size} bytes, over the {max_file_bytes}-byte cap"
                elif total + member.size > max_total_bytes:
                    out.refused[report] = f"over the {max_total_bytes}-byte total cap"
                else:
                    f = tar.extractfile(member)
                    data = f.read(max_file_bytes + 1) if f is not None else b""
                    total += len(data)
                    out.files[report] = data
    except tarfile.TarError as e:
        for report in pending.values():
            out.refused[report] = f"unreadable archive: {e}"
        return out
    for report in pending.values():
        out.refused[report] = "no such file"
    return out


__all__ = ["Collected", "check_relpath", "collect_files", "collect_from_tar", "files_to_tar", "write_files"]
