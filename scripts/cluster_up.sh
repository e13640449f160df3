#!/usr/bin/env bash
# A real two-node Ray cluster on one machine: a head and a worker as separate hosts.
#
#   sudo scripts/cluster_up.sh            # prints the RAY_ADDRESS to use
#   scripts/cluster_exec.sh ray status     # run anything where it reaches the cluster
#   sudo scripts/cluster_down.sh           # stops everything cluster_up started
#   scripts/cluster_kill_node.sh worker    # the worker node dies (all its processes)
#   scripts/cluster_up.sh --rejoin-worker  # ... and comes back (a fresh raylet joins)
#
# Each node lives in its own network namespace (medray-head, medray-worker) joined by a
# veth pair: its own IP address, and no other interface, so Ray traffic cannot leave the
# veth. Each node also has its own mount namespace in which /var/lib/medray-node is a
# private folder (the node's local disk: what a Train worker on another node cannot see),
# its own Ray temp dir, and both see $MEDRAY_CLUSTER_DIR/shared at the same path (the
# shared storage, like an NFS mount). Needs root (ip netns, mount).
#
# Settings (environment): MEDRAY_CLUSTER_DIR (default /tmp/medray-cluster),
# MEDRAY_CLUSTER_SUBNET (default 10.77.0), HEAD_CPUS / WORKER_CPUS (logical CPUs, default 2),
# RAY (the ray executable, default the project's .venv/bin/ray), HEALTH_CHECK_MS (the
# head's node health-check period: a lost node is declared dead after 5 missed checks).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${MEDRAY_CLUSTER_DIR:-/tmp/medray-cluster}
NET=${MEDRAY_CLUSTER_SUBNET:-10.77.0}
RAY=${RAY:-$ROOT/.venv/bin/ray}
HEAD_IP=$NET.1 WORKER_IP=$NET.2
LOCAL=/var/lib/medray-node

REJOIN=0
[[ ${1:-} == --rejoin-worker ]] && REJOIN=1
if [[ $REJOIN == 0 && -e $DIR/cluster.env ]]; then
    echo "cluster_up: a cluster is already up (state in $DIR); run scripts/cluster_down.sh" >&2
    exit 2
fi
# Ray's socket paths (DIR/head/ray/session_<date>_<pid>/sockets/plasma_store) must fit
# in AF_UNIX's 107 bytes.
if (( ${#DIR} > 40 )); then
    echo "cluster_up: MEDRAY_CLUSTER_DIR=$DIR is too long for Ray's socket paths (max 40 chars)" >&2
    exit 2
fi
[[ -x $RAY ]] || { echo "cluster_up: no ray executable at $RAY (set RAY=...)" >&2; exit 2; }
# Start one Ray node inside (netns, private mount namespace with its own local disk).
# The Ray daemons keep the mount namespace alive after `ray start` returns.
start_node() {  # NAME IP ARGS...
    local name=$1 ip=$2; shift 2
    ip netns exec "medray-$name" unshare --mount --propagation private bash -c '
        mount --bind "$1" "$2" && shift 2 && exec "$@"' _ \
        "$DIR/$name/local" "$LOCAL" \
        env PATH="$(dirname "$RAY"):$PATH" RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled \
        RAY_health_check_period_ms="${HEALTH_CHECK_MS:-1000}" \
        RAY_health_check_timeout_ms="${HEALTH_CHECK_MS:-1000}" \
        RAY_health_check_failure_threshold=5 \
        GLOO_SOCKET_IFNAME=medray0 NCCL_SOCKET_IFNAME=medray0 \
        "$RAY" start --node-ip-address "$ip" --temp-dir "$DIR/$name/ray" \
        --resources "{\"medray-$name\": 1}" --disable-usage-stats "$@" \
        >"$DIR/$name/start.log" 2>&1
}
if [[ $REJOIN == 1 ]]; then
    [[ -e $DIR/cluster.env ]] || { echo "cluster_up: no cluster to rejoin" >&2; exit 2; }
    [[ -z $(ip netns pids medray-worker) ]] || { echo "cluster_up: the worker is still up" >&2; exit 2; }
    start_node worker "$WORKER_IP" --address "$HEAD_IP:6379" --num-cpus "${WORKER_CPUS:-2}"
    echo "worker $WORKER_IP rejoined"
    exit 0
fi
mkdir -p "$DIR"/{head,worker}/{ray,local} "$DIR/shared" "$LOCAL"
failed() {
    echo "cluster_up: failed; cleaning up" >&2
    tail -n 20 "$DIR"/*/start.log >&2 2>/dev/null || true
    "$ROOT/scripts/cluster_down.sh" >/dev/null 2>&1 || true
}
trap failed ERR

# Two hosts joined by one cable.
ip netns add medray-head
ip netns add medray-worker
ip link add medray-h0 type veth peer name medray-w0
ip link set medray-h0 netns medray-head
ip link set medray-w0 netns medray-worker
# Inside its host, each end is called medray0, like eth0 on every machine of a real
# cluster: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name one interface for all nodes.
ip -n medray-head link set medray-h0 name medray0
ip -n medray-worker link set medray-w0 name medray0
ip -n medray-head addr add "$HEAD_IP/24" dev medray0
ip -n medray-worker addr add "$WORKER_IP/24" dev medray0
for ns in medray-head medray-worker; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set medray0 up
done

start_node head "$HEAD_IP" --head --port 6379 --num-cpus "${HEAD_CPUS:-2}" \
    --dashboard-host "$HEAD_IP" --dashboard-port 8265 --include-dashboard true
start_node worker "$WORKER_IP" --address "$HEAD_IP:6379" --num-cpus "${WORKER_CPUS:-2}"

cat >"$DIR/cluster.env" <<ENV
MEDRAY_CLUSTER_DIR=$DIR
MEDRAY_SHARED=$DIR/shared
RAY_ADDRESS=$HEAD_IP:6379
MEDRAY_DASHBOARD=http://$HEAD_IP:8265
RAY_AUTH_MODE=disabled
ENV

# Both nodes registered and alive, seen from the head's side of the cable.
"$ROOT/scripts/cluster_exec.sh" "$(dirname "$RAY")/python" - <<'PY'
import time

import ray

ray.init(log_to_driver=False)
for _ in range(120):
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= 2:
        break
    time.sleep(1)
else:
    raise SystemExit(f"cluster_up: only {len(alive)} node(s) joined")
PY
echo "cluster up: head $HEAD_IP, worker $WORKER_IP, shared storage $DIR/shared"
echo "RAY_ADDRESS=$HEAD_IP:6379 (run commands with scripts/cluster_exec.sh CMD...)"
