#!/usr/bin/env bash
# Run a command where it reaches the two-node cluster of cluster_up.sh: on the head's side
# of the veth (its network namespace), with RAY_ADDRESS and the shared path set.
#   scripts/cluster_exec.sh ray job submit --working-dir . -- python -m medray train ...
set -euo pipefail
DIR=${MEDRAY_CLUSTER_DIR:-/tmp/medray-cluster}
if [[ ! -e $DIR/cluster.env ]]; then
    echo "cluster_exec: no cluster is up (no $DIR/cluster.env); run scripts/cluster_up.sh" >&2
    exit 2
fi
set -a
# shellcheck disable=SC1091
source "$DIR/cluster.env"
set +a
exec ip netns exec medray-head "$@"
