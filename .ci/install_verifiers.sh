#!/usr/bin/env bash
# Installs verifiers 0.4 into its own virtualenv, $AGENTRL_CACHE/verifiers-venv (default
# ~/.cache/agentrl/verifiers-venv): verifiers 0.4 pins mcp==2.0.0, which litellm[mcp] in the main environment
# refuses, so the downgrade stays inside this venv. It sees agentrl and its dependencies through a .pth file that
# adds the site-packages of the python running this script (a venv's or the system's), after its own (so its own
# mcp wins). tests/agents/test_verifiers_venv.py runs the verifiers tests with its python. Idempotent.
set -euo pipefail
venv="${AGENTRL_CACHE:-$HOME/.cache/agentrl}/verifiers-venv"
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import verifiers.v1, agentrl" 2>/dev/null \
  && grep -qF "$site" "$venv"/lib/python3*/site-packages/agentrl-host.pth 2>/dev/null; then
  echo "verifiers already in $venv (sees $site)"; exit 0
fi
python3 -m venv "$venv"
own=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# addsitedir, not a plain path line: the host's own .pth files (an editable agentrl) must be processed too
echo "import site; site.addsitedir('$site')" > "$own/agentrl-host.pth"
"$venv/bin/pip" install -q "verifiers>=0.4,<0.5"
"$venv/bin/python" -c "import verifiers, agentrl; print('verifiers', verifiers.__version__, 'installed in $venv')"
