#!/usr/bin/env bash
# Installs SGLang (pinned: agentrl/engine/sglang/install.py SGLANG_VERSION) into its own virtualenv,
# $AGENTRL_CACHE/sglang-venv (default ~/.cache/agentrl/sglang-venv): it pins its own torch (~11 GB with
# CUDA wheels), which must not replace the project's CPU torch. Idempotent; agentrl finds it there.
# The same code as `agentrl setup sglang`, run from this checkout by any python3 (the module is stdlib only,
# so agentrl's dependencies need not be installed yet); retries are .ci/run's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m agentrl.engine.sglang.install "$@"
