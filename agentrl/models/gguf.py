"""A GGUF model file -> a cached HF safetensors directory, converted once.

Owns :func:`find_gguf` (is a ``model.path`` a GGUF: a ``.gguf`` file, or a directory without
``config.json`` holding exactly one; several is a ``ConfigError`` listing them) and
:func:`converted_dir` (the HF directory every engine and the trainer load instead). The key of a
conversion is the file's content: ``$AGENTRL_CACHE/gguf/<sha256>`` (``~/.cache/agentrl`` by default),
so a renamed or copied file is converted once and an edited one again. The sha256 is computed
streaming and remembered per (path, size, mtime, inode) under ``gguf/hashes/``, so a multi-GB file is
not re-read by every command. The conversion runs in a temporary directory renamed into place under
a lock (``agentrl.common.cache_entry.cached``): an interrupted conversion is never used, and the next
one removes its leftovers.

How: transformers reads the file with the ``gguf`` package (``from_pretrained(..., gguf_file=...)``,
weights dequantized to float32); that model refuses ``save_pretrained``, so a plain model is built
from the same config on the meta device, given the dequantized tensors and saved as safetensors,
with the tokenizer (and the chat template the file carries) and the generation config. The saved
tokenizer is reloaded and must encode a probe exactly as the file's did. What transformers cannot
read (an architecture, a quantization type, a tokenizer type) is one ``ConfigError`` naming the file,
its architecture and quantization types, and transformers' reason. ``agentrl_gguf.json`` in the
directory records the source, its sha256 and the conversion time.

Does not: run GGUF models natively (no llama.cpp), keep weights quantized, download GGUF files from
the Hub (``agentrl.models.hub`` skips them), or check the chat template
(``agentrl.episodes.tokenizer`` does, for every model).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from pathlib import Path

from agentrl.common.cache_entry import cached, say
from agentrl.common.paths import cache_dir
from agentrl.errors import ConfigError

SUFFIX = ".gguf"
META = "agentrl_gguf.json"
_CHUNK = 8 * 2**20
#: text the saved tokenizer must encode exactly as the file's own (special tokens, digits, unicode, JSON)
_PROBE = 'Hello <|im_start|>user\n 17 * 23 = 391 ünïcødé ✓ <tool_call>{"name": "python"}</tool_call>\n\n  end'


def find_gguf(path: str | Path, what: str = "model.path") -> Path | None:
    """The GGUF file ``path`` names: ``path`` itself if it is a ``.gguf`` file, the one ``.gguf`` of a
    directory without ``config.json`` (an HF directory holding a GGUF export stays an HF directory);
    None when ``path`` is no GGUF. ConfigError when the directory holds several."""
    p = Path(path).expanduser()
    if p.is_file():
        return p if p.name.lower().endswith(SUFFIX) else None
    if not p.is_dir() or (p / "config.json").exists():
        return None
    found = sorted(f for f in p.iterdir() if f.is_file() and f.name.lower().endswith(SUFFIX))
    if len(found) > 1:
        raise ConfigError(
            f"{what}: {str(path)!r} holds {len(found)} GGUF files ({', '.join(f.name for f in found)}); "
            "pass the one to use as the path of the file itself"
        )
    return found[0] if found else None


def sha256_of(path: Path) -> str:
    """The file's sha256, read in chunks (never the whole file in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def content_key(path: Path, cache: Path | None = None) -> str:
    """``sha256_of(path)``, remembered under ``cache``/hashes for the file's (path, size, mtime, inode)."""
    st = path.stat()
    real = str(path.resolve())
    stamp = {"path": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    memo = (cache or gguf_cache()) / "hashes" / (hashlib.sha256(real.encode()).hexdigest()[:32] + ".json")
    try:
        seen = json.loads(memo.read_text())
        if {k: seen.get(k) for k in stamp} == stamp and len(str(seen.get("sha256", ""))) == 64:
            return str(seen["sha256"])
    except (OSError, ValueError, AttributeError):
        pass
    digest = sha256_of(path)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**stamp, "sha256": digest}))
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only cache only costs the next command a re-hash
    return digest


def gguf_cache() -> Path:
    return cache_dir() / "gguf"


def converted_dir(gguf: str | Path, what: str = "model.path") -> Path:
    """The cached HF directory of ``gguf``, converting it first if this content was never converted
    (one line on stderr says so and where). ConfigError when transformers cannot read the file."""
    src = Path(gguf).expanduser()
    if not src.is_file():
        raise ConfigError(f"{what}: GGUF file {str(gguf)!r} does not exist")
    digest = content_key(src)
    dest = gguf_cache() / digest
    if (dest / "config.json").exists():
        return dest

    def build(tmp: Path) -> None:
        say(
            f"converting {src.name} ({_size(src.stat().st_size)} GGUF) once into an HF model directory "
            f"{dest} (float32 safetensors; cached by the file's sha256)"
        )
        convert(src, tmp, what)
        meta = json.loads((tmp / META).read_text())
        (tmp / META).write_text(json.dumps({**meta, "sha256": digest}, indent=2))

    return cached(dest, build)


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def describe(src: Path) -> tuple[str, list[str]]:
    """(architecture, quantization types with their tensor counts) read from the file's header with the
    ``gguf`` package; ConfigError when it is not a GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError("model.path: reading a GGUF file needs the gguf package: pip install gguf") from None
    try:
        reader = GGUFReader(str(src))
        field = reader.fields.get("general.architecture")
        arch = field.contents() if field is not None else "(none stated)"
        kinds = Counter(t.tensor_type.name for t in reader.tensors)
    except Exception as e:  # noqa: BLE001 - a truncated file, bad magic, an unknown tensor type: one error
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ConfigError(f"model.path: {src} is not a readable GGUF file: {first}") from None
    return str(arch), [f"{k} x{n}" for k, n in kinds.most_common()]


def _unreadable(src: Path, arch: str, quants: list[str], e: BaseException, what: str) -> ConfigError:
    import transformers

    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return ConfigError(
        f"{what}: transformers {transformers.__version__} cannot read {src.name} (architecture {arch!r}, "
        f"tensor types {', '.join(quants) or 'none'}): {type(e).__name__}: {first}. Use a GGUF of an "
        "architecture and quantization transformers reads, or the model's HF safetensors directory"
    )


def _dequantized() -> dict:
    """from_pretrained kwargs asking for plain float weights: newer transformers may keep a GGUF's
    blocks packed (GgufConfig); older ones always dequantize and have no such option."""
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def convert(src: Path, out: Path, what: str = "model.path") -> dict:
    """Write the HF directory of GGUF ``src`` into ``out`` (see the module doc); returns its meta."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    arch, quants = describe(src)
    t0 = time.perf_counter()
    where, name = str(src.parent), src.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32, **_dequantized())
    except ImportError as e:
        raise ConfigError(f"{what}: reading {src.name} needs the gguf package ({e}): pip install gguf") from None
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a file it cannot read
        raise _unreadable(src, arch, quants, e, what) from None
    state = loaded.state_dict()
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(state, assign=True, strict=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    again = AutoTokenizer.from_pretrained(str(out))
    if again.encode(_PROBE, add_special_tokens=False) != tokenizer.encode(_PROBE, add_special_tokens=False):
        raise ConfigError(
            f"{what}: the tokenizer of {src.name}, saved as an HF tokenizer, encodes differently from the "
            f"file's own (transformers {transformers.__version__}); this GGUF's tokenizer cannot be converted"
        )
    meta = {
        "source": str(src.resolve()),
        "size": src.stat().st_size,
        "architecture": arch,
        "tensor_types": quants,
        "parameters": sum(p.numel() for p in plain.parameters()),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "convert_s": round(time.perf_counter() - t0, 2),
        "transformers": transformers.__version__,
    }
    (out / META).write_text(json.dumps(meta, indent=2))
    return meta
