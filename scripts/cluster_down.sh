#!/usr/bin/env bash
# Stop everything cluster_up.sh started: the processes of both node namespaces (found by
# namespace, never by name: other Ray clusters on this machine stay up), the namespaces
# and their veth pair, and the state folder.
set -uo pipefail
DIR=${MEDRAY_CLUSTER_DIR:-/tmp/medray-cluster}
for ns in medray-worker medray-head; do
    ip netns list | grep -qw "$ns" || continue
    pids=$(ip netns pids "$ns")
    [[ -n $pids ]] && kill -TERM $pids 2>/dev/null
    for _ in $(seq 20); do
        [[ -z $(ip netns pids "$ns") ]] && break
        sleep 0.5
    done
    pids=$(ip netns pids "$ns")
    [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
    ip netns delete "$ns"
done
# Only a folder cluster_up.sh made (it holds cluster.env or its node folders) is removed.
if [[ -e $DIR/cluster.env || -d $DIR/head/ray ]]; then
    rm -rf "$DIR"
fi
rmdir /var/lib/medray-node 2>/dev/null || true
echo "cluster down"
