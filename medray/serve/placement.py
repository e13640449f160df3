"""Where a Serve application's replicas run: the snapshot `medray serve` records once the
application is up (`LOGS/placement.json` and one console line).

The data is what `serve status` and the dashboard's Serve page show. `serve.status()` drops
the node fields, so this reads the controller's instance details through the Serve client
(the call `serve.status()` itself makes). Serve moves replicas when a node is lost: this
is the placement at start-up, not a live view.
"""

from __future__ import annotations

from typing import Any

HOW = ("Serve replicas of the application right after it became ready (the Serve "
       "controller's instance details, as `serve status` reads them); Serve replaces "
       "replicas on other nodes when one is lost, so this is the start-up placement")


def replica_placement(app_name: str) -> dict[str, list[dict[str, Any]]]:
    """{deployment: [{replica_id, state, node_id, node_ip}, ...]} for one application."""
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()
    app = details.get("applications", {}).get(app_name) or {}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, deployment in sorted(app.get("deployments", {}).items()):
        replicas = [{"replica_id": r.get("replica_id"),
                     "state": str(getattr(r.get("state"), "value", r.get("state"))),
                     "node_id": r.get("node_id"), "node_ip": r.get("node_ip")}
                    for r in deployment.get("replicas", [])]
        out[name] = sorted(replicas, key=lambda r: (r["node_ip"] or "", r["replica_id"] or ""))
    return out


def placement_line(placement: dict[str, list[dict[str, Any]]]) -> str:
    """'LLMServer x2 on 10.0.0.1, 10.0.0.2; QAIngress x1 on 10.0.0.1'."""
    parts = []
    for name, replicas in placement.items():
        nodes = sorted({str(r["node_ip"]) for r in replicas})
        parts.append(f"{name} x{len(replicas)} on {', '.join(nodes) or 'no node'}")
    return "; ".join(parts) or "no replicas"
