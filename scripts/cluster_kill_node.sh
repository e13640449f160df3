#!/usr/bin/env bash
# Simulate losing a node of the cluster_up.sh cluster: SIGKILL every process of its
# namespace (raylet, object store, workers), as a machine that loses power would.
#   scripts/cluster_kill_node.sh worker
set -euo pipefail
node=${1:?usage: cluster_kill_node.sh worker|head}
pids=$(ip netns pids "medray-$node")
[[ -n $pids ]] || { echo "cluster_kill_node: nothing runs on $node" >&2; exit 2; }
kill -KILL $pids
for _ in $(seq 50); do  # gone once the kernel has reaped them
    [[ -z $(ip netns pids "medray-$node") ]] && break
    sleep 0.1
done
echo "killed $(wc -w <<<"$pids") process(es) of node $node"
