"""OpenAI/vLLM conventions a client relies on, found by trying the server as a client would
(2026-11-30): retrieving a model, ``model`` on every body vLLM sends it in, ``stream_options``
only with ``stream``, errors naming the field as the client wrote it, and the OpenAPI document
(exact integer bounds, the bearer scheme, open docs, 200 body schemas)."""

from __future__ import annotations

from typing import Optional

import pytest
from pydantic import BaseModel

from prodip.serve.routes import Svc
from tests.serve.conftest import LOCAL, wait_ready


def test_retrieve_model_as_the_openai_client_does(client):
    listed = client.get("/v1/models").json()["data"][0]
    r = client.get(f"/v1/models/{listed['id']}")
    assert r.status_code == 200 and r.json() == listed
    r = client.get("/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "route, body",
    [
        ("/tokenize", {"prompt": "a"}),
        ("/detokenize", {"tokens": [5]}),
        ("/v1/generate", {"prompt": "a", "max_new_tokens": 1}),
    ],
)
def test_model_field_is_accepted_and_checked(client, route, body):
    """vLLM's /tokenize and /detokenize take ``model``; /v1/generate answers with one, so it takes one."""
    name = client.get("/v1/models").json()["data"][0]["id"]
    alone, named = client.post(route, json=body), client.post(route, json={**body, "model": name})
    assert alone.status_code == named.status_code == 200, named.text
    if route != "/v1/generate":
        assert alone.json() == named.json()
    r = client.post(route, json={**body, "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_stream_options_only_with_stream(client):
    body = {"prompt": "a", "max_tokens": 1, "stream_options": {"include_usage": True}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options", r.text
    assert client.post("/v1/completions", json={**body, "stream": True}).status_code == 200


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({"prompt": 5}, "prompt", "got a number; expected a string, a list of strings,"),
        ({"prompt": None}, "prompt", "got null"),
        ({"prompt": ["a", 5]}, "prompt", "got a list"),
        ({"prompt": "a", "stop": 3}, "stop", "expected a string or a list of strings"),
        (
            {"prompt": "a", "stream_options": {"include_usage": "yes"}, "stream": True},
            "stream_options.include_usage",
            "",
        ),
    ],
)
def test_errors_name_the_field_not_the_union_member(client, body, param, says):
    err = client.post("/v1/completions", json=body).json()["error"]
    assert err["param"] == param and says in err["message"], err


def test_body_that_is_not_a_json_object_says_so(client):
    for content, headers in (
        (b"", {}),
        (b'{"prompt": "a"}', {"content-type": "text/plain"}),
        (b"[1, 2]", {"content-type": "application/json"}),
    ):
        r = client.post("/v1/completions", content=content, headers=headers)
        assert r.status_code == 400, r.text
        assert "must be a JSON object" in r.json()["error"]["message"]


def test_too_many_prompts_names_prompt(client):
    from prodip.serve.service import MAX_SEQUENCES_PER_REQUEST

    r = client.post("/v1/completions", json={"prompt": ["a"] * (MAX_SEQUENCES_PER_REQUEST + 1), "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 1000})
    assert r.json()["error"]["param"] == "max_new_tokens"


def test_openapi_document_matches_the_server(client):
    doc = client.get("/openapi.json").json()
    seed = doc["components"]["schemas"]["CompletionRequest"]["properties"]["seed"]["anyOf"][0]
    assert seed["maximum"] == 2**63 - 1 and seed["minimum"] == -(2**63)  # exact, not 2**63 as a float
    assert isinstance(seed["maximum"], int)
    ok = doc["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"] == {"$ref": "#/components/schemas/CompletionResponse"}
    assert "requestBody" in doc["paths"]["/v1/chat/completions"]["post"]
    assert doc["paths"]["/v1/models/{model}"]["get"]["responses"]["404"]
    assert "securitySchemes" not in doc["components"]  # this server has no key


def test_with_an_api_key_the_document_declares_it_and_docs_stay_readable(tiny_export):
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    with TestClient(create_app(tiny_export[0], "fp32", api_key="sekret"), base_url=LOCAL) as c:
        wait_ready(c)
        assert c.get("/docs").status_code == 200  # a browser cannot send the key to read them
        doc = c.get("/openapi.json").json()
        assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
        assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
        assert doc["paths"]["/health"]["get"]["security"] == []  # OpenAPI's "no key needed"
        assert "401" not in doc["paths"]["/health"]["get"]["responses"]
        assert c.get("/health").status_code == 200 and c.get("/playground").status_code == 200
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200


class EchoRequest(BaseModel):
    """The body of the test route below (module level, as ``Svc``: FastAPI resolves the handler's
    annotations, strings under ``from __future__ import annotations``, in the module's namespace)."""

    model: Optional[str] = None
    text: str


class EchoResponse(BaseModel):
    text: str
    model: str


def test_a_new_route_needs_no_other_edit(tiny_export):
    """A route added to a server (here by a test, on its own router) gets its metrics label from the
    app's route table and its OpenAPI statuses from what it declares plus what every route shares;
    a route declared OPEN needs no key. Nothing else was edited for either."""
    from fastapi import APIRouter
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app
    from prodip.serve.openapi import OPEN, errors

    extra = APIRouter()

    @extra.post("/v1/echo/{times}", response_model=None, responses={200: {"model": EchoResponse}, **errors(404)})
    async def echo(times: int, req: EchoRequest, svc: Svc) -> dict[str, str]:
        svc.check_model(req.model)
        return {"text": req.text * times, "model": svc.model_name}

    @extra.get("/v1/open-ping", openapi_extra=OPEN)
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    app = create_app(tiny_export[0], "fp32", api_key="sekret")
    app.include_router(extra)
    key = {"Authorization": "Bearer sekret"}
    with TestClient(app, base_url=LOCAL) as c:
        wait_ready(c)
        assert c.post("/v1/echo/2", json={"text": "ab"}, headers=key).json() == {"text": "abab", "model": "export"}
        assert c.post("/v1/echo/2", json={"text": "ab", "model": "x"}, headers=key).status_code == 404
        assert c.post("/v1/echo/2", json={"text": 3}, headers=key).status_code == 400  # not FastAPI's 422
        assert c.post("/v1/echo/2", json={"text": "ab"}).status_code == 401
        assert c.get("/v1/open-ping").json() == {"pong": "yes"}  # OPEN: no key
        assert c.get("/v1/nowhere", headers=key).status_code == 404
        text = c.get("/metrics", headers=key).text
        doc = c.get("/openapi.json").json()
    from prometheus_client.parser import text_string_to_metric_families

    counts = {
        (sample.labels["route"], sample.labels["status"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "prodip_requests_total"
    }
    for status in ("200", "404", "400", "401"):
        assert counts[("/v1/echo/{times}", status)] == 1.0, counts
    assert counts[("/v1/open-ping", "200")] == 1.0
    assert counts[("other", "404")] == 1.0  # only a path no route matches is "other"
    op = doc["paths"]["/v1/echo/{times}"]["post"]
    assert set(op["responses"]) == {"200", "400", "401", "404", "413", "500"}
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EchoResponse"
    }
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    assert all(op["responses"][c]["content"]["application/json"]["schema"] == error for c in ("400", "401", "404"))
    assert op["security"] == [{"bearer": []}]
    open_op = doc["paths"]["/v1/open-ping"]["get"]
    assert set(open_op["responses"]) == {"200", "500"} and open_op["security"] == []


@pytest.mark.parametrize(
    "bind, allowed, host, served",
    [
        ("127.0.0.1", (), "127.0.0.1:8000", True),
        ("127.0.0.1", (), "localhost:8000", True),
        ("127.0.0.1", (), "LOCALHOST.", True),  # case and the root dot do not matter
        ("127.0.0.1", (), "[::1]:8000", True),
        ("127.0.0.1", (), "evil.example:8000", False),  # a name rebound to 127.0.0.1
        ("127.0.0.1", (), "127.0.0.1.evil.example", False),
        ("127.0.0.1", (), "10.0.0.5:8000", False),  # not the bound address
        ("127.0.0.1", ("myhost.lan",), "MyHost.lan:8000", True),
        ("127.0.0.1", ("*.example.org",), "api.example.org", True),
        ("127.0.0.1", ("*.example.org",), "example.org.evil.example", False),
        ("127.0.0.1", ("*",), "evil.example", True),  # the check turned off
        ("10.0.0.5", (), "10.0.0.5:8000", True),  # bound to one address: that address
        ("10.0.0.5", (), "10.0.0.6:8000", False),
        ("0.0.0.0", (), "192.168.1.20:8000", True),  # every interface: any IP literal is its own
        ("::", (), "[fe80::1]:8000", True),
        ("0.0.0.0", (), "box.lan:8000", False),  # a name must be listed
    ],
)
def test_host_check_table(bind, allowed, host, served):
    from prodip.serve.config import HostCheck, ServeConfig

    assert HostCheck(ServeConfig(host=bind, allowed_hosts=allowed)).allows(host) is served
    assert HostCheck(ServeConfig(host=bind, allowed_hosts=allowed, api_key="k")).allows(host)  # a key: any Host


def test_a_foreign_host_is_refused_without_an_api_key(client, tiny_export):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example.
    Without a key the server refuses it on every route (open ones too), in OpenAI's error form; a named
    host is served, and a key makes the Host irrelevant (the page cannot know the key)."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    evil = {"Host": "evil.example:8000"}
    for method, path, body in (
        ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 1}),
        ("GET", "/metrics", None),
        ("GET", "/health", None),
        ("GET", "/playground", None),
    ):
        r = client.request(method, path, json=body, headers=evil)
        assert r.status_code == 403, (path, r.text)
        err = r.json()["error"]
        assert err["type"] == "permission_error" and err["code"] == "host_not_allowed"
        assert "'evil.example:8000' is not served" in err["message"] and "--allowed-hosts" in err["message"]
    assert client.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 200
    assert "403" in client.get("/openapi.json").json()["paths"]["/v1/completions"]["post"]["responses"]
    # no lifespan: nothing loaded, so a served Host gets /health's 503 and a refused one the 403 before it
    named = TestClient(create_app(tiny_export[0], allowed_hosts=("*.example",)), base_url=LOCAL)
    assert named.get("/health", headers=evil).status_code == 503
    assert named.get("/health", headers={"Host": "other.test"}).status_code == 403
    keyed = TestClient(create_app(tiny_export[0], api_key="k"), base_url=LOCAL)
    assert keyed.get("/health", headers={"Host": "other.test"}).status_code == 503
    from prodip.base.errors import InvalidInput

    with pytest.raises(InvalidInput, match="allowed_hosts: 'http://a' is not a host name"):
        create_app(tiny_export[0], allowed_hosts=("http://a",))
