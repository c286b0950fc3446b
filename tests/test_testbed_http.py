"""The reference engine over real HTTP: protocol, auth, bad input, concurrency."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from prober.testbed import TestbedServer
from tests.support.keys import BEARER_A
from tests.support.testbed import SMALL, StartTestbed
from tests.support.waiting import wait_for


def test_unknown_or_missing_key_is_401_json(testbed: StartTestbed) -> None:
    server = testbed("healthy", **SMALL)
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic testbed-key-a"}):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"}, headers=headers)
        assert r.status_code == 401
        assert r.json()["type"] == "AuthenticationError"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_models_and_server_info_expose_advertised_context_and_real_pool(testbed: StartTestbed) -> None:
    server = testbed("incident")
    models = httpx.get(server.url + "/v1/models", headers=BEARER_A).json()
    assert models["data"][0]["max_model_len"] == 1_048_576
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(server.url + path, headers=BEARER_A).json()
        assert info["max_total_num_tokens"] == 681_280
        assert info["max_req_input_len"] == 681_274
        assert info["page_size"] == 64
        assert info["context_length"] == 1_048_576
        assert info["disaggregation_mode"] == "prefill"


def test_tokenize_prompt_and_chat_forms_match_usage(testbed: StartTestbed) -> None:
    server = testbed("healthy", **SMALL)
    text = "Quote the document. The vault code of Morwenna Quill is 4471-Z."
    tok = httpx.post(server.url + "/v1/tokenize", headers=BEARER_A, json={"prompt": text}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 16_384
    done = httpx.post(server.url + "/v1/completions", headers=BEARER_A, json={"prompt": text}).json()
    assert done["usage"]["prompt_tokens"] == tok["count"]

    messages = [{"role": "user", "content": text}]
    chat_tok = httpx.post(server.url + "/v1/tokenize", headers=BEARER_A, json={"messages": messages}).json()
    assert chat_tok["count"] > tok["count"]  # the chat template costs tokens
    chat = httpx.post(server.url + "/v1/chat/completions", headers=BEARER_A, json={"messages": messages}).json()
    assert chat["usage"]["prompt_tokens"] == chat_tok["count"]
    assert "4471-Z" in chat["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"\xff\xfe\x00bad", 400, "UTF-8"),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps({"prompt": "x"}).encode(), 400, "messages"),
        (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "content"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "role"),
        (json.dumps({"messages": [{"role": "user", "content": ""}]}).encode(), 400, "empty"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}).encode(),
         400, "max_tokens"),
        (json.dumps([1, 2]).encode(), 400, "invalid request"),
    ],
)
def test_bad_input_gets_clean_4xx_json(
    testbed: StartTestbed, body: bytes, status: int, fragment: str
) -> None:
    server = testbed("healthy", **SMALL)
    r = httpx.post(server.url + "/v1/chat/completions", content=body,
                   headers={**BEARER_A, "Content-Type": "application/json"})
    assert r.status_code == status
    assert fragment in r.json()["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_body_over_the_cap_is_413_even_without_content_length(testbed: StartTestbed) -> None:
    server = testbed("healthy", **SMALL, max_body_bytes=4096)
    big = json.dumps({"prompt": "x" * 10_000}).encode()
    assert httpx.post(server.url + "/v1/completions", content=big, headers=BEARER_A).status_code == 413

    def chunks():  # chunked transfer: no Content-Length to check up front
        yield big[:3000]
        yield big[3000:]

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers=BEARER_A)
    assert r.status_code == 413 and r.json()["type"] == "RequestTooLarge"


def test_prompt_over_the_advertised_context_is_400(testbed: StartTestbed) -> None:
    server = testbed("incident", **SMALL)
    r = httpx.post(server.url + "/v1/completions", headers=BEARER_A, json={"prompt": "word " * 20_000})
    assert r.status_code == 400
    assert "longer than the model's context length (16384 tokens)" in r.json()["message"]
    r = httpx.post(server.url + "/v1/completions", headers=BEARER_A,
                   json={"prompt": "word " * 100, "max_tokens": 16_384})
    assert r.status_code == 400 and "Requested token count exceeds" in r.json()["message"]


def test_metrics_report_pools_and_requests(testbed: StartTestbed) -> None:
    server = testbed("incident", **SMALL)
    httpx.post(server.url + "/v1/completions", headers=BEARER_A, json={"prompt": "hello there"})
    text = httpx.get(server.url + "/metrics").text
    assert 'leakprobe_testbed_kv_pool_tokens{pool="prefill"} 4096.0' in text
    assert 'leakprobe_testbed_kv_pool_tokens{pool="decode"}' in text
    assert 'leakprobe_testbed_requests_total{code="200",route="completions"} 1.0' in text


def test_many_tenants_concurrently_keep_pool_bookkeeping_intact(testbed: StartTestbed) -> None:
    tenants = {f"t{i}": f"key-{i}" for i in range(8)}
    server = testbed("incident", **SMALL, tenants=tenants, pool_wait_seconds=20)
    failures: list[str] = []

    def client(name: str, key: str) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for i in range(12):
                words = 50 + (i * 397) % 1500  # below and (i % 4 == 3) above the pool
                size = words if i % 4 else 5_000
                r = http.post("/v1/completions", headers={"Authorization": f"Bearer {key}"},
                              json={"prompt": f"{name} " * size, "stream": i % 2 == 0})
                if r.status_code != 200:
                    failures.append(f"{name}: {r.status_code} {r.text[:200]}")
                server.engine.check_invariants()

    threads = [threading.Thread(target=client, args=item) for item in tenants.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    server.engine.check_invariants()
    assert server.engine.paging.prefill_pool.usage().pages_used == 0
    assert server.engine.paging.decode_pool is not None and server.engine.paging.decode_pool.usage().pages_used == 0


def writes_paused(server: TestbedServer) -> bool:
    """Whether uvicorn paused writing on one of the engine's connections: it holds answers its client does not
    read (the server's own state, read from this thread: a flag)."""
    connections = list(server._server.server_state.connections)  # uvicorn's, behind the engine
    flows = [getattr(connection, "flow", None) for connection in connections]  # an HTTP connection's
    return any(flow is not None and flow.write_paused for flow in flows)


def test_stop_closes_a_connection_whose_client_stopped_reading(testbed: StartTestbed) -> None:
    """A client that sends many requests and reads nothing (as a killed container or a stalled gateway does)
    leaves answers unsent when the engine stops: stop() must close its socket all the same, not leave it
    open until the garbage collector warns about it in some later test."""
    server = testbed("healthy")
    body = json.dumps({"prompt": "word " * 2_000, "max_tokens": 100_000, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: testbed\r\nContent-Type: application/json\r\n"
               + f"Authorization: {BEARER_A['Authorization']}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4_096)
        client.connect(("127.0.0.1", server.port))
        # ~55 KB an answer: 150 of them (8 MB) are more than the kernel's buffers take (here ~2.8 MB), so the
        # server blocks with answers still to write (uvicorn pauses writing on the connection).
        client.sendall(request * 150)
        wait_for(lambda: writes_paused(server), "the engine to block on answers its client does not read",
                 progress=lambda: server.engine.stats.prompt_tokens)
        server.stop()
        assert not server.running
        client.settimeout(60)  # what is buffered drains in well under a second; a socket left open never ends
        try:
            while client.recv(1 << 20):
                pass
        except ConnectionResetError:
            pass  # an abort is a reset: the point is that the socket is closed
        except TimeoutError:
            pytest.fail("the engine stopped but left the connection open")
