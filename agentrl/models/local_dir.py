"""Is this directory a usable HF model? One check, run before any command loads a model.

Owns :func:`check_model_dir`: the directory exists; ``config.json`` is UTF-8 JSON holding an object
that transformers can read; the weights exist (``model.safetensors``, a sharded index whose every
shard exists, or ``pytorch_model.bin``) and each safetensors file's header is intact and matches
the file's size (so an empty, truncated or random file is caught without reading the tensors); a
tokenizer is there. Each failure is a ``ConfigError`` naming the file and the problem. Used by
``agentrl.models.hub.resolve_model`` (a local directory, or the snapshot a Hub id resolved to) and
``agentrl serve``.

Does not: verify tensor contents (checkpoints carry checksums for that: ``agentrl.trainer.manifest``),
nor load the model.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.common.bounded import BadText, decode, parse_text
from agentrl.errors import ConfigError

#: Any one of these (or vocab.json with merges.txt) is a tokenizer transformers can load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.txt", "spiece.model")
_MAX_HEADER = 100 * 2**20  # safetensors' own cap on the JSON header


def _json_file(f: Path, what: str) -> object:
    try:
        return parse_text(decode(f.read_bytes()), json.loads)
    except OSError as e:
        raise ConfigError(f"{what}: {f} cannot be read: {e.strerror or e}") from None
    except BadText as e:
        raise ConfigError(f"{what}: {f}: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what}: {f} is not valid JSON ({e.msg} at line {e.lineno})") from None


def safetensors_problem(f: Path) -> str | None:
    """Why ``f`` is not a complete safetensors file, from its header and size alone; None if it is."""
    size = f.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    if size < 8:
        return f"is truncated ({size} bytes, shorter than a safetensors header)"
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        head = fh.read(min(n, size - 8, _MAX_HEADER))
    if n > _MAX_HEADER or not head.startswith(b"{"):
        return "is not a safetensors file (no JSON header at its start)"
    if n > size - 8:
        return f"is truncated ({size} bytes, inside its {n}-byte header)"
    try:
        header = json.loads(head)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError):
        return "is not a safetensors file (its header is not valid safetensors JSON)"
    expected = 8 + n + max(ends, default=0)
    if size < expected:
        return f"is truncated ({size} bytes; its header describes {expected})"
    if size > expected:
        return f"does not match its header ({size} bytes; the header describes {expected})"
    return None


def _check_weights(d: Path, what: str) -> None:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        data = _json_file(index, what)
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            raise ConfigError(f"{what}: {index} has no weight_map")
        files = sorted({str(v) for v in wmap.values()})
    elif (d / "model.safetensors").exists():
        files = ["model.safetensors"]
    elif (d / "pytorch_model.bin").is_file() or (d / "pytorch_model.bin.index.json").is_file():
        return  # pickled weights: no header to check without loading them
    else:
        raise ConfigError(
            f"{what}: {d} has no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)"
        )
    for name in files:
        f = d / name
        if not f.is_file():
            raise ConfigError(
                f"{what}: weight file {f} is missing" + (f" (named by {index.name})" if index.is_file() else "")
            )
        problem = safetensors_problem(f)
        if problem:
            raise ConfigError(f"{what}: weight file {f} {problem}")


def _check_config(d: Path, what: str) -> None:
    f = d / "config.json"
    if not f.is_file():
        raise ConfigError(
            f"{what}: {str(d)!r} is not an HF model directory (no config.json); pass an HF model "
            "directory, a Hub id ('org/name'), or null for the built-in model"
        )
    data = _json_file(f, what)
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {f} must hold a JSON object, got {type(data).__name__}")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(d))
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a config it cannot use
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(
            f"{what}: {f} cannot be read by transformers (model_type {data.get('model_type')!r}): {first}"
        ) from None


def _check_tokenizer(d: Path, what: str) -> None:
    if any((d / n).is_file() for n in TOKENIZER_FILES) or (
        (d / "vocab.json").is_file() and (d / "merges.txt").is_file()
    ):
        return
    raise ConfigError(
        f"{what}: {d} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)} or vocab.json + "
        "merges.txt); copy them from the base model"
    )


def check_model_dir(path: str | Path, what: str = "model.path") -> Path:
    """``path`` as a Path if it is a usable HF model directory; else ConfigError (see module doc)."""
    d = Path(path).expanduser()
    if not d.exists():
        raise ConfigError(
            f"{what}: {str(path)!r} does not exist; pass an HF model directory, a Hub id "
            "('org/name'), or null for the built-in model"
        )
    if not d.is_dir():
        raise ConfigError(f"{what}: {str(path)!r} is a file, not an HF model directory")
    _check_config(d, what)
    _check_weights(d, what)
    _check_tokenizer(d, what)
    return d
