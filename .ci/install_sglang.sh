#!/usr/bin/env bash
# Installs SGLang (pinned: agentrl/engine/sglang_server.py SGLANG_VERSION) into its own virtualenv,
# $AGENTRL_CACHE/sglang-venv (default ~/.cache/agentrl/sglang-venv): it pins its own torch (~11 GB with
# CUDA wheels), which must not replace the project's CPU torch. Idempotent; agentrl finds it there.
set -euo pipefail
version=$(python3 -c "import re,sys; print(re.search(r'SGLANG_VERSION = \"([^\"]+)\"', open(sys.argv[1]).read()).group(1))" \
  "$(dirname "$0")/../agentrl/engine/sglang_server.py")
venv="${AGENTRL_CACHE:-$HOME/.cache/agentrl}/sglang-venv"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import sglang, sys; sys.exit(sglang.__version__ != '$version')" 2>/dev/null; then
  echo "sglang $version already in $venv"; exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q "sglang==$version"
"$venv/bin/python" -c "import sglang; print('sglang', sglang.__version__, 'installed in $venv')"
