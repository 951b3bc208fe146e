#!/usr/bin/env bash
# Installs verifiers 0.4 into its own virtualenv, $AGENTRL_CACHE/verifiers-venv (default
# ~/.cache/agentrl/verifiers-venv), made with --system-site-packages so that it sees agentrl and its
# dependencies: verifiers 0.4 pins mcp==2.0.0, which litellm[mcp] in the main environment refuses, so the
# downgrade stays inside this venv. tests/agents/test_verifiers_venv.py runs the verifiers tests with its
# python. Idempotent.
set -euo pipefail
venv="${AGENTRL_CACHE:-$HOME/.cache/agentrl}/verifiers-venv"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import verifiers.v1, agentrl" 2>/dev/null; then
  echo "verifiers already in $venv"; exit 0
fi
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q "verifiers>=0.4,<0.5"
"$venv/bin/python" -c "import verifiers, agentrl; print('verifiers', verifiers.__version__, 'installed in $venv')"
