"""What ``pip install PKG_DIR`` leaves behind for entry-point discovery, minus pip: a ``.dist-info`` with
``METADATA`` and ``entry_points.txt`` generated from the package's own pyproject. Put the dist-info's
parent and the package's directory on the path and ``importlib.metadata`` finds its entry points."""

from __future__ import annotations

from pathlib import Path


def install_as_dist_info(pkg_dir: Path, site: Path) -> dict:
    """Write ``pkg_dir``'s dist-info under ``site``; returns its pyproject's ``[project]`` table."""
    import tomllib  # Python 3.11+: callers skip on older interpreters

    meta = tomllib.loads((pkg_dir / "pyproject.toml").read_text())["project"]
    dist = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
    lines = []
    for group, eps in meta["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in eps.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return meta
