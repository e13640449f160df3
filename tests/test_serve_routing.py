"""Several LLM replicas: the prefix-aware router keeps a patient's /v1/qa questions on one
replica (real Serve app, two vLLM replicas of the tiny model), and its config."""

from __future__ import annotations

import asyncio
import random

import pytest
import yaml
from typer.testing import CliRunner

from medray.cli import app
from medray.serve.config import AppConfig
from medray.serve.llm import llm_config
from medray.serve.routing import ROUTER_PATH, prompt_key


def test_routing_defaults_to_prefix_with_several_replicas():
    def routing(**kw):
        return AppConfig(model="m", device="cpu", **kw).routing

    assert routing() == "default"
    assert routing(llm={"num_replicas": 2}) == "prefix"
    assert routing(llm={"autoscaling": {"min_replicas": 1, "max_replicas": 3}}) == "prefix"
    assert routing(llm={"num_replicas": 2}, routing="default") == "default"
    assert routing(routing="prefix") == "prefix"  # allowed: replicas may be added later

    cfg = AppConfig(model="m", device="cpu", llm={"num_replicas": 2},
                    prefix_routing={"imbalanced_threshold": 8, "max_tree_tokens": 10_000})
    router = llm_config(cfg, "m", "m", False).deployment_config["request_router_config"]
    assert router["request_router_class"] == ROUTER_PATH
    assert router["request_router_kwargs"] == {
        "imbalanced_threshold": 8, "match_rate_threshold": 0.1, "do_eviction": True,
        "eviction_threshold_chars": 10_000, "eviction_target_chars": 9_000}
    # Serve's own router: no request_router_config at all.
    plain = AppConfig(model="m", device="cpu", llm={"num_replicas": 2}, routing="default")
    assert "request_router_config" not in llm_config(plain, "m", "m", False).deployment_config
    # What the ingress ships to the replicas validates again, to the same routing.
    assert AppConfig.model_validate(plain.resolved().model_dump(mode="json")).routing == "default"


@pytest.mark.parametrize(("args", "message"), [
    ({"routing": "sticky"}, "routing"),
    ({"routing": "default", "prefix_routing": {"match_rate_threshold": 0.5}},
     "prefix_routing is set but routing is 'default'"),
    ({"prefix_routing": {"match_rate_threshold": 1.5}}, "match_rate_threshold"),
    ({"prefix_routing": {"imbalanced_threshold": -1}}, "imbalanced_threshold"),
    ({"prefix_routing": {"bogus": 1}}, "bogus"),
])
def test_bad_routing_configs_are_rejected_with_the_key(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        AppConfig(model="m", device="cpu", **args)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"applications": [{"import_path": "medray.serve.app:build_app",
                                                     "args": {"model": "m", "device": "cpu",
                                                              **args}}]}))
    res = CliRunner().invoke(app, ["serve", "--config", str(bad)])
    assert res.exit_code == 2 and "bad.yaml" in res.output, res.output


def test_prompt_keys_share_a_prefix_exactly_when_the_prompts_do():
    epicrisis = list(range(300, 340))
    one, two = prompt_key([epicrisis + [7, 8]]), prompt_key([epicrisis + [9]])
    assert len(one) == 42 and one[:40] == two[:40] and one[40] != two[40]
    assert prompt_key("text prompt") == "text prompt"
    assert prompt_key([5]) == prompt_key([[5]]) != prompt_key([6])  # readiness probe shape
    assert prompt_key([[1, 2], [3]]) == prompt_key([1, 2, 3])  # chunks: all pieces in order
    assert prompt_key([]) == prompt_key(None) == ""  # nothing to match: load-balanced


@pytest.fixture(scope="module")
def two_replicas(ray_session, tiny_model, medqaro_prepared):
    """Two LLM replicas of the tiny model (small KV cache), prefix routing, E+Q+A prompts."""
    import socket

    from ray import serve
    from ray.serve.context import _get_global_client

    from medray.data.prepared import load_prepared
    from medray.serve.app import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})  # kept if already up
    port = _get_global_client().http_config.port
    cfg = AppConfig(model=str(tiny_model), device="cpu", max_model_len=512,
                    llm={"num_replicas": 2}, require_auth=False, api_keys_env=None,
                    engine_kwargs={"kv_cache_memory_bytes": 2**24},
                    prompt={"format": "eqa", "context_tokens": 256, "max_new_tokens": 2},
                    ready_cache_s=3600)  # no readiness probe among the counted requests
    serve.run(build_app(cfg), name="routing", route_prefix="/routing")
    data = load_prepared(medqaro_prepared).split("test")
    patients: dict[str, list[str]] = {}
    for q, c in zip(data["question"], data["context_id"], strict=True):
        patients.setdefault(c, []).append(q)
    contexts = load_prepared(medqaro_prepared)
    yield (f"http://127.0.0.1:{port}/routing",
           {c: (contexts.context(c), qs[:4]) for c, qs in list(patients.items())[:4]})
    serve.delete("routing")


def test_a_patients_questions_stay_on_one_replica(two_replicas):
    import httpx

    from medray.serve.routing import llm_deployments, replica_cache_stats

    url, four = two_replicas
    patients = dict(list(four.items())[:2])
    assert len(patients) == 2 and all(len(qs) == 4 for _, qs in patients.values())
    (deployment,) = llm_deployments("routing")

    async def ask(client: httpx.AsyncClient, ctx: str, q: str) -> None:
        r = await client.post("/v1/qa", json={"question": q, "context": ctx})
        assert r.status_code == 200, r.text

    async def run() -> dict[str, list[int]]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(1)
            seen: dict[str, list[int]] = {}
            for cid, (ctx, questions) in patients.items():
                before = replica_cache_stats("routing", deployment)
                # the first question alone (the router learns the prefix when it routes),
                # then the rest at once, in shuffled order
                await ask(client, ctx, questions[0])
                rest = random.Random(0).sample(questions[1:], len(questions) - 1)
                await asyncio.gather(*(ask(client, ctx, q) for q in rest))
                after = replica_cache_stats("routing", deployment)
                seen[cid] = [after[r]["requests"] - before[r]["requests"] for r in sorted(after)]
                hits = [after[r]["hits"] - before[r]["hits"] for r in sorted(after)]
                assert max(hits) > 0, hits  # the later questions reuse the epicrisis
            return seen

    seen = asyncio.run(run())
    first, second = seen.values()
    assert sorted(first) == [0, 4] and sorted(second) == [0, 4], seen
    assert first != second, seen  # a new patient goes to the replica with less cached


def test_new_patients_asked_at_once_split_across_replicas(two_replicas):
    """Two new patients' questions all at once, interleaved: each patient's questions go
    to one replica (the first routed records the epicrisis before the others decide),
    and the two patients to different replicas (the one holding fewer patients)."""
    import httpx
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    from medray.serve.routing import llm_deployments, replica_cache_stats

    url, four = two_replicas
    (a, (ctx_a, qs_a)), (b, (ctx_b, qs_b)) = list(four.items())[2:]
    (deployment,) = llm_deployments("routing")
    items = [(a, ctx_a, q) for q in qs_a] + [(b, ctx_b, q) for q in qs_b]
    random.Random(1).shuffle(items)

    async def run() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            while (await client.get("/readyz")).status_code != 200:
                await asyncio.sleep(1)
            rs = await asyncio.gather(*(client.post("/v1/qa", json={
                "question": q, "context": ctx, "return_prompt_ids": True}) for _, ctx, q in items))
            assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
            return [r.json()["prompt_ids"][0] for r in rs]

    before = replica_cache_stats("routing", deployment)
    prompts = asyncio.run(run())
    after = replica_cache_stats("routing", deployment)
    assert [after[r]["requests"] - before[r]["requests"] for r in sorted(after)] == [4, 4]
    # where the router recorded each question: one replica per patient, two replicas
    tree = ray.get_actor("LlmPrefixTreeActor",
                         namespace=f"{SERVE_NAMESPACE}::routing::{deployment}")
    owners: dict[str, set[str]] = {a: set(), b: set()}
    for (cid, _, _), ids in zip(items, prompts, strict=True):
        matched, tenants = ray.get(tree.prefix_match.remote(prompt_key(ids)))
        assert len(matched) == len(ids) and len(tenants) == 1, (len(matched), tenants)
        owners[cid].update(tenants)
    assert all(len(o) == 1 for o in owners.values()) and owners[a] != owners[b], owners


def test_routing_goes_on_after_the_prefix_tree_is_lost(two_replicas):
    """The prefix tree's actor dies (as with its node): the next questions are answered
    (by load, while the router starts a fresh tree) and the fresh tree records them."""
    import httpx
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    from medray.serve.routing import llm_deployments

    url, four = two_replicas
    ctx, questions = next(iter(four.values()))
    (deployment,) = llm_deployments("routing")
    namespace = f"{SERVE_NAMESPACE}::routing::{deployment}"
    old = ray.get_actor("LlmPrefixTreeActor", namespace=namespace)
    ray.kill(old, no_restart=True)
    with httpx.Client(base_url=url, timeout=300) as client:
        codes = [client.post("/v1/qa", json={"question": q, "context": ctx}).status_code
                 for q in questions]
    assert codes == [200] * len(questions), codes
    tree = ray.get_actor("LlmPrefixTreeActor", namespace=namespace)
    assert tree._actor_id != old._actor_id
    assert ray.get(tree.get_smallest_tenants.remote())  # the replicas are its tenants
