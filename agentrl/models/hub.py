"""A model reference -> a local HF model directory: an existing directory, a GGUF file, or a Hub id.

Owns :func:`resolve_model`: ``model.path`` (and ``model.revision``) to a checked local directory.
An existing path is a local directory (checked by ``agentrl.models.local_dir``), or a GGUF file (or a
directory holding one), converted once into a cached HF directory by ``agentrl.models.gguf``; otherwise
``org/name`` or ``org/name@revision`` is a Hub id, fetched with ``huggingface_hub.snapshot_download``
into the standard HF cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub),
so a second run, or any other HF tool, reuses it. The environment is read at each call, not at
import: ``HF_ENDPOINT`` (a mirror), ``HF_HUB_OFFLINE=1`` (the cache only, no network) and
``HF_TOKEN`` (gated and private models). The token goes to the Hub client and nowhere else: never
into a message, a log line or the resolved config (which keeps the id as the user wrote it).

Each way a Hub id can fail is a ``ConfigError`` naming the id: offline and not cached, not found,
gated or unauthorized (naming HF_TOKEN), the revision missing, the Hub unreachable.

Does not: load the model, or decide the built-in default model (``agentrl.warmstart.default_model``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.models.gguf import converted_dir, find_gguf
from agentrl.models.local_dir import check_model_dir

#: A Hub repo id: ``namespace/name`` with the Hub's characters, optional ``@revision``.
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<rev>[\w./-]{1,200}))?$")
#: Files of other frameworks and exports a torch run never reads: not downloaded.
SKIP = (
    "*.onnx",
    "*.onnx_data",
    "onnx/*",
    "*.gguf",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.tflite",
    "*.mlmodel",
    "openvino/*",
    "original/*",
    "coreml/*",
)
#: Pickled torch weights, skipped when the repo also has safetensors.
PICKLED = ("*.bin", "*.pt", "*.pth")


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_ref(ref: str, revision: str | None = None, what: str = "model.path") -> Path | HubRef:
    """``ref`` as an existing local path, else a Hub id (``revision`` pins it unless ``ref`` carries
    ``@rev``; both and different is an error). ConfigError if it is neither."""
    local = Path(ref).expanduser()
    if local.exists():
        if revision is not None:
            raise ConfigError(f"model.revision: {revision!r} applies to Hub ids, but {what} {ref!r} is a local path")
        return local
    if ref.lower().endswith(".gguf"):  # a file name, never a Hub id
        raise ConfigError(f"{what}: GGUF file {ref!r} does not exist")
    m = _HUB_ID.match(ref)
    if not m or ".." in ref or ref.startswith(("/", ".", "~")):
        raise ConfigError(
            f"{what}: {ref!r} does not exist and is not a Hub id ('org/name' or 'org/name@revision'); "
            "pass a local HF model directory, a GGUF file, a Hub id, or null for the built-in model"
        )
    rev = m.group("rev")
    if rev and revision and rev != revision:
        raise ConfigError(f"model.revision: {revision!r} disagrees with the revision in {what} {ref!r}")
    return HubRef(m.group("repo"), rev or revision)


def hub_cache_dir(environ: dict | None = None) -> Path:
    """The standard HF hub cache, as huggingface_hub computes it, read from the environment now."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def offline(environ: dict | None = None) -> bool:
    """``HF_HUB_OFFLINE`` set to a true value (1, true, yes, on)."""
    env = os.environ if environ is None else environ
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_endpoint(environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    return (env.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _token(environ: dict | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None


def scrub(text: str, environ: dict | None = None) -> str:
    """``text`` with the Hub token (if any) replaced: for anything that may reach a message."""
    tok = _token(environ)
    return text.replace(tok, "***") if tok else text


def skip_patterns(files: list[str]) -> list[str]:
    """What not to download from a repo holding ``files``: other frameworks' files always, pickled
    torch weights when safetensors are there too."""
    if any(f.endswith(".safetensors") for f in files):
        return [*SKIP, *PICKLED]
    return list(SKIP)


def _status(e: BaseException) -> int | None:
    resp = getattr(e, "response", None)
    return getattr(resp, "status_code", None)


def explain(e: BaseException, ref: HubRef, what: str = "model.path") -> ConfigError:
    """The ConfigError for a failed Hub fetch of ``ref`` (the token scrubbed from anything quoted)."""
    from huggingface_hub import errors as E

    tail = "set HF_TOKEN to a token that may read it (and accept the model's terms on its Hub page)"
    name = f"{what}: Hub model {str(ref)!r}"
    status = _status(e)
    if isinstance(e, E.GatedRepoError):
        return ConfigError(
            f"{name} is gated ({status or 'HTTP 401/403'}): "
            + ("the HF_TOKEN given may not read it; " if _token() else "no HF_TOKEN is set; ")
            + tail
        )
    if isinstance(e, E.RevisionNotFoundError):
        return ConfigError(
            f"{name}: revision {ref.revision!r} does not exist (404); use a branch, tag or commit "
            "of the repo, or model.revision: null for main"
        )
    if isinstance(e, E.RepositoryNotFoundError) or status == 404:
        return ConfigError(
            f"{name} was not found on {hub_endpoint()} ({status or 404}); check the id, or if it is private {tail}"
        )
    if status in (401, 403):
        return ConfigError(
            f"{name}: access refused ({status}): "
            + ("the HF_TOKEN given is not accepted for it; " if _token() else "no HF_TOKEN is set; ")
            + tail
        )
    if isinstance(e, E.LocalEntryNotFoundError) and offline():
        return ConfigError(
            f"{name} is not in the HF cache {hub_cache_dir()} and HF_HUB_OFFLINE=1 forbids "
            "downloading it; download it once with network access (unset HF_HUB_OFFLINE), or "
            "pass a local directory"
        )
    if isinstance(e, getattr(E, "IncompleteSnapshotError", ())):
        return ConfigError(
            f"{name}: the cached copy in {hub_cache_dir()} is incomplete and the Hub cannot be "
            "reached to finish it; retry with network access"
        )
    if (
        isinstance(e, E.LocalEntryNotFoundError)
        or isinstance(e, OSError)
        or type(e).__module__.startswith(("httpx", "requests", "urllib3"))
    ):
        return ConfigError(
            f"{name} cannot be downloaded: {hub_endpoint()} is not reachable and the model is not "
            f"in the HF cache {hub_cache_dir()} ({type(e).__name__}); check the network (or "
            "HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to use only cached models"
        )
    first = (scrub(str(e)).strip().splitlines() or [type(e).__name__])[0][:200]
    return ConfigError(f"{name} cannot be fetched ({status or type(e).__name__}): {first}")


def _repo_files(ref: HubRef) -> list[str] | None:
    """The repo's file list (to choose what to skip), or None if it cannot be listed now (the
    download then reports why, or falls back to the cache)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=hub_endpoint(), token=_token()).model_info(ref.repo_id, revision=ref.revision)
    except Exception:  # noqa: BLE001 - snapshot_download meets the same failure and it is explained there
        return None
    return [s.rfilename for s in info.siblings or []]


def cached_snapshot(ref: HubRef, cache: Path | None = None) -> Path | None:
    """The cached snapshot directory of ``ref`` (its revision through ``refs/``, or a commit), or None."""
    folder = (cache or hub_cache_dir()) / ("models--" + ref.repo_id.replace("/", "--"))
    rev = ref.revision or "main"
    commit = rev
    ref_file = folder / "refs" / rev
    if ref_file.is_file():
        commit = ref_file.read_text().strip()
    snap = folder / "snapshots" / commit
    return snap if commit and snap.is_dir() else None


def _cached_files(ref: HubRef) -> list[str] | None:
    snap = cached_snapshot(ref)
    return None if snap is None else [str(f.relative_to(snap)) for f in snap.rglob("*") if f.is_file()]


def download(ref: HubRef, what: str = "model.path") -> Path:
    """The local snapshot directory of ``ref`` in the HF cache, downloading what is missing.
    ConfigError (``explain``) when it can be neither found in the cache nor downloaded."""
    from huggingface_hub import snapshot_download

    is_offline = offline()
    files = None if is_offline else _repo_files(ref)
    if files is None:  # offline or unreachable: skip what the cached copy skipped, so it reads as complete
        files = _cached_files(ref) or []
    try:
        path = snapshot_download(
            ref.repo_id,
            revision=ref.revision,
            cache_dir=str(hub_cache_dir()),
            endpoint=hub_endpoint(),
            token=_token(),
            local_files_only=is_offline,
            ignore_patterns=skip_patterns(files),
        )
    except Exception as e:  # noqa: BLE001 - every failure becomes one ConfigError naming the id
        raise explain(e, ref, what) from None
    return Path(path)


def resolve_model(ref: str, revision: str | None = None, what: str = "model.path") -> Path:
    """A usable local HF model directory for ``ref`` (a local directory, a GGUF file or a directory
    holding one, converted once into the agentrl cache, or a Hub id fetched into the HF cache), checked
    by ``agentrl.models.local_dir.check_model_dir``. ConfigError names the reference and the problem."""
    target = parse_ref(str(ref), revision, what)
    if isinstance(target, HubRef):
        return check_model_dir(download(target, what), f"{what} ({target})")
    gguf = find_gguf(target, what)
    if gguf is not None:  # converted once into a cached HF directory, which everything then loads
        return check_model_dir(converted_dir(gguf, what), f"{what} ({gguf.name}, converted)")
    return check_model_dir(target, what)
