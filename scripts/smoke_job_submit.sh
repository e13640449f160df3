#!/usr/bin/env bash
# Smoke test: submit jobs/finetune.py with `ray job submit` to a local Ray head.
#   flock /tmp/medray-heavy.lock scripts/smoke_job_submit.sh
# Starts a PRIVATE head (its own ports and temp dir, `--block` in the background) and stops
# only that head at the end (never `ray stop`, which would stop every cluster on the host).
# Takes about 2 min on 2 cores. Exit status 0 when the job SUCCEEDED and wrote an adapter.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"     # the job's `python` is the project's venv
export RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false
# Ray 2.60 local heads may enable token auth; this private smoke head runs without it.
export RAY_AUTH_MODE=disabled
WORK=$(mktemp -d /tmp/medray-smoke.XXXXXX)
PORT=${SMOKE_GCS_PORT:-6391}; DASH=${SMOKE_DASHBOARD_PORT:-8291}

medray data synth --dataset medqaro --out "$WORK/raw" --scale small >/dev/null
medray data prepare --dataset medqaro --input "$WORK/raw" --out "$WORK/data" >/dev/null
medray model tiny --out "$WORK/tiny" --corpus "$WORK/data"

ray start --head --block --port "$PORT" --dashboard-host 127.0.0.1 --dashboard-port "$DASH" \
    --num-cpus 4 --include-dashboard true --temp-dir "$WORK/ray" >"$WORK/head.log" 2>&1 &
HEAD_PID=$!
trap 'kill "$HEAD_PID" 2>/dev/null; wait "$HEAD_PID" 2>/dev/null || true' EXIT
export RAY_ADDRESS="http://127.0.0.1:$DASH"
for _ in $(seq 60); do ray job list >/dev/null 2>&1 && break; sleep 2; done

# .venv is not git-ignored everywhere: exclude it (and data) from the uploaded working dir.
ray job submit --runtime-env-json \
    '{"working_dir": ".", "excludes": [".venv", "runs", ".git", "*.egg-info"]}' -- \
    python jobs/finetune.py --config configs/tiny-cpu.yaml --output "$WORK/run" \
    model.name_or_path="$WORK/tiny" data.path="$WORK/data" \
    data.max_train_examples=128 data.max_val_examples=32 data.val_generate_examples=8 \
    prompt.context_tokens=128 optim.epochs=1

test -f "$WORK/run/adapter/adapter_config.json"
echo "smoke ok: adapter in $WORK/run/adapter, metrics in $WORK/run/metrics.json"
