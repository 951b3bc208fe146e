"""The sandbox image: built offline (debootstrap + ``docker import``), no registry needed.

Owns: ``build_image`` (what ``agentrl sandbox build`` runs), the image's fixed facts that the
Docker backend relies on (``SANDBOX_UID``, ``WORKDIR``, ``DEFAULT_TAG``) and ``image_exists``.

The recipe: ``debootstrap --variant=minbase --include=python3 bookworm ROOTFS MIRROR`` (a
minimal Debian with the full Python standard library: graders use ``json``, ``io``,
``contextlib``; ``python3-minimal`` lacks them), then:

* a user ``sandbox`` (uid/gid 1000, home ``/work``): programs and the container's pid 1 (the
  executor, ``agentrl.sandbox.docker.agent.executor``, which a program cannot signal: it is its pid
  namespace's init) run as it; nothing in the container runs as root;
* setuid/setgid bits stripped from every file (``no-new-privileges`` already neuters them;
  this is the second lock on the same door);
* apt lists, docs and man pages removed (smaller image, faster import);
* ``tar -C ROOTFS -c . | docker import`` with ``PATH``/``LANG``/``WORKDIR`` and a label recording
  the recipe version, so a rebuild is skipped when the tag already holds this recipe.

Does not: install anything from a registry, pin package versions (bookworm's current ones are
taken), or run as non-root (debootstrap needs root). ``agentrl/sandbox/docker/Dockerfile`` is the registry
equivalent for machines that have one.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from agentrl.errors import SandboxError

DEFAULT_TAG = "agentrl-sandbox:latest"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SUITE = "bookworm"
DEFAULT_PACKAGES = ("python3",)
#: uid/gid programs run as inside the container (created in the image).
SANDBOX_UID = 1000
#: the size-capped tmpfs every program starts in (HOME and TMPDIR point here too).
WORKDIR = "/work"
#: bump when the image recipe changes: images labelled with an older one are rebuilt.
RECIPE_VERSION = "2"
#: bump when the debootstrapped tree itself changes (the --rootfs-cache key).
ROOTFS_VERSION = "1"
LABEL = "agentrl.sandbox.image"

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TRIM = ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/info")


def image_exists(client, tag: str) -> bool:
    """True when ``tag`` exists and was built from this recipe version."""
    import docker

    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return (img.labels or {}).get(LABEL) == RECIPE_VERSION


def _debootstrap(
    rootfs: Path, *, suite: str, mirror: str, packages: tuple[str, ...], log: Callable[[str], None]
) -> None:
    exe = shutil.which("debootstrap")
    if exe is None:
        raise SandboxError("debootstrap is not installed (apt-get install -y debootstrap)")
    if os.geteuid() != 0:
        raise SandboxError("building the sandbox image needs root (debootstrap creates device nodes and chowns)")
    cmd = [exe, "--variant=minbase", f"--include={','.join(packages)}", suite, str(rootfs), mirror]
    log("running: " + " ".join(cmd))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise SandboxError(f"debootstrap {suite} from {mirror} failed (exit {proc.returncode}):\n{tail}")
    log(f"debootstrap done in {time.monotonic() - t0:.0f} s")


def _customize(rootfs: Path) -> None:
    """Add the sandbox user, the work dir mount point; strip setuid bits; trim caches."""
    etc = rootfs / "etc"
    passwd = (etc / "passwd").read_text()
    if not any(line.split(":")[2:3] == [str(SANDBOX_UID)] for line in passwd.splitlines()):
        with open(etc / "passwd", "a") as f:
            f.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:agentrl sandbox:{WORKDIR}:/bin/sh\n")
        with open(etc / "group", "a") as f:
            f.write(f"sandbox:x:{SANDBOX_UID}:\n")
        if (etc / "shadow").exists():
            with open(etc / "shadow", "a") as f:
                f.write("sandbox:!:19000:0:99999:7:::\n")
    (rootfs / WORKDIR.lstrip("/")).mkdir(mode=0o755, exist_ok=True)
    for rel in _TRIM:
        p = rootfs / rel
        if p.is_dir():
            shutil.rmtree(p)
            p.mkdir()
    for dirpath, _dirs, names in os.walk(rootfs):
        for name in names:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


def _tar_stream(rootfs: Path) -> Iterator[bytes]:
    # GNU tar keeps device nodes, owners and xattrs exactly as debootstrap made them.
    proc = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        while chunk := proc.stdout.read(1 << 20):
            yield chunk
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise SandboxError(f"tar of {rootfs} failed: {err.strip()[-500:]}")


def build_image(
    client=None,
    *,
    tag: str = DEFAULT_TAG,
    rootfs_cache: str | os.PathLike | None = None,
    mirror: str = DEFAULT_MIRROR,
    suite: str = DEFAULT_SUITE,
    packages: tuple[str, ...] = DEFAULT_PACKAGES,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> str:
    """Build ``tag`` offline and return its image id; a no-op when it exists (unless ``force``).

    ``rootfs_cache``: a directory kept between builds; the debootstrapped tree is stored under it
    and reused (the slow ~30 s step). Without it a temp dir is used and removed.
    """
    import docker

    client = client or docker.from_env()
    if not force and image_exists(client, tag):
        img = client.images.get(tag)
        log(f"{tag} already built ({img.short_id}); use --force to rebuild")
        return img.id
    if ":" not in tag.rsplit("/", 1)[-1]:
        tag += ":latest"
    try:
        old_id = client.images.get(tag).id
    except docker.errors.ImageNotFound:
        old_id = None
    repo, _, version = tag.rpartition(":")
    tmp = None
    if rootfs_cache is not None:
        rootfs = Path(rootfs_cache) / f"{suite}-{'-'.join(packages)}-r{ROOTFS_VERSION}"
        done = rootfs.with_name(rootfs.name + ".complete")
        if not done.exists() or force:
            if rootfs.exists():
                shutil.rmtree(rootfs)
            rootfs.parent.mkdir(parents=True, exist_ok=True)
            _debootstrap(rootfs, suite=suite, mirror=mirror, packages=packages, log=log)
            _customize(rootfs)
            done.touch()
        else:
            log(f"reusing cached rootfs {rootfs}")
    else:
        tmp = tempfile.mkdtemp(prefix="agentrl-rootfs-")
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(rootfs, suite=suite, mirror=mirror, packages=packages, log=log)
        _customize(rootfs)
    try:
        log(f"importing {rootfs} as {tag}")
        changes = [
            f"ENV PATH={_PATH}",
            "ENV LANG=C.UTF-8",
            f"WORKDIR {WORKDIR}",
            f"USER {SANDBOX_UID}:{SANDBOX_UID}",
            f"LABEL {LABEL}={RECIPE_VERSION}",
            'CMD ["sleep", "infinity"]',
        ]
        try:
            client.api.import_image(
                src=_tar_stream(rootfs), repository=repo, tag=version, changes=changes, stream_src=True
            )
        except docker.errors.APIError as e:
            raise SandboxError(f"docker import of {rootfs} as {tag} failed: {e}") from e
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    img = client.images.get(tag)
    log(f"built {tag} ({img.short_id}, {img.attrs.get('Size', 0) / 2**20:.0f} MiB)")
    if old_id is not None and old_id != img.id:
        try:  # the replaced image is now untagged; it stays only while a container still uses it
            client.images.remove(old_id)
        except docker.errors.APIError:
            pass
    return img.id
