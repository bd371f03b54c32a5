"""The cluster's local reply config (the EnvoyPatchPolicy's, gennstack/gateway/envoy_common.py) on
real Envoy: Envoy's own 400s become OpenAI-style JSON while the AI Gateway's own JSON answers pass
through, and a 429 says when the limit that refused it resets.

How the cluster's filters make their answers, each pinned upstream, and what stands in for them:

* AI Gateway v1.1.0 ``internal/extproc/processor_impl.go`` ``createUserFacingErrorResponse``: an
  ext_proc ImmediateResponse, body ``{"type":"error","error":{...}}`` and a header mutation setting
  ``content-type: application/json``; Envoy's ext_proc filter (``sendImmediateResponse``) calls
  ``sendLocalReply`` with the mutation as its header callback.
* Envoy's global rate limit filter (``source/extensions/filters/http/ratelimit/ratelimit.cc``
  ``complete``): over the limit, ``sendLocalReply(429, ...)`` with ``populateResponseHeaders`` as the
  header callback, which adds the x-ratelimit-* headers Envoy Gateway v1.8.3 turns on
  (``internal/xds/translator/ratelimit.go``: DRAFT_VERSION_03); ``x-ratelimit-reset`` is the
  ``duration_until_reset`` of the descriptor with the least left (``XRateLimitHeaderUtils::create``),
  which envoyproxy/ratelimit reports per fixed window (the minute's, the hour's).
* Both stand-ins here are a Lua filter's ``respond()``, which Envoy also turns into ``sendLocalReply``
  with the given headers as the header callback: the same path into the local reply mapper. Envoy's
  own 400 is the real one, from its HTTP/1 codec.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from gennstack.gateway.config import GatewayConfig, routing_table
from gennstack.gateway.envoy_common import AI_GATEWAY_JSON_STATUSES, CLUSTER_RETRY_AFTER_S, local_reply_config
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap
from gennstack.gateway.values import envoy_patch_values

pytestmark = [pytest.mark.slow]

AI_GATEWAY_400 = '{"type":"error","error":{"type":"BadRequest","code":"400","message":"malformed request"}}'
AI_GATEWAY_422 = AI_GATEWAY_400.replace('"400"', '"422"')
# Seconds to the end of the minute window (request budget) and of the hour window (token budget).
MINUTE_RESET_S, HOUR_RESET_S = 37, 2891

LUA = f"""
function envoy_on_request(handle)
  local path = handle:headers():get(":path")
  if path == "/ai/400" then
    handle:respond({{[":status"] = "400", ["content-type"] = "application/json"}}, [[{AI_GATEWAY_400}]])
  elseif path == "/ai/422" then
    handle:respond({{[":status"] = "422", ["content-type"] = "application/json"}}, [[{AI_GATEWAY_422}]])
  elseif path == "/limit/minute" or path == "/limit/hour" then
    local reset = path == "/limit/minute" and "{MINUTE_RESET_S}" or "{HOUR_RESET_S}"
    handle:respond({{[":status"] = "429", ["x-ratelimit-limit"] = "10, 10;w=60, 100000;w=3600",
                    ["x-ratelimit-remaining"] = "0", ["x-ratelimit-reset"] = reset}}, "")
  elseif path == "/limit/plain" then
    handle:respond({{[":status"] = "429"}}, "")
  elseif path == "/plain/400" then
    handle:respond({{[":status"] = "400"}}, "the request body is not valid JSON")
  end
end
"""


def _gateway(local_replies: dict) -> LocalGateway:
    gateway = GatewayConfig()
    bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": "http://127.0.0.1:1"}, gateway,
                                LocalSettings(listen_port=0, admin_port=0, rate_limit_requests=0))
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["local_reply_config"] = local_replies
    hcm["http_filters"] = [
        {"name": "envoy.filters.http.lua", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": LUA}}},
        *[f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.router"],
    ]
    hcm["route_config"] = {"name": "test", "virtual_hosts": [{"name": "test", "domains": ["*"], "routes": [
        {"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]}
    bootstrap["static_resources"]["clusters"] = []
    return LocalGateway.start(bootstrap)


def _get(gw: LocalGateway, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"{gw.base_url.removesuffix('/v1')}{path}", timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _raw(gw: LocalGateway, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 exchange (Envoy closes the connection after a codec error)."""
    port = int(gw.base_url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.fixture(scope="module")
def cluster_gateway():
    with _gateway(envoy_patch_values()["localReplyConfig"]) as gw:
        yield gw


def test_envoys_own_400_is_openai_json_in_the_cluster(cluster_gateway) -> None:
    """A request Envoy's HTTP/1 codec refuses (a header name with a space) and a plain-text 400 of
    another filter get the OpenAI-style JSON error; before, the AI Gateway's pass-through mapper for
    400 came first and matched them too, so they stayed text."""
    status, headers, body = _raw(cluster_gateway, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nbad header: 1\r\n\r\n")
    assert status == 400 and headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request")
    status, headers, body = _get(cluster_gateway, "/plain/400")
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == {"message": "the request body is not valid JSON",
                                        "type": "invalid_request_error", "code": "invalid_request"}


def test_the_ai_gateways_json_answers_pass_through(cluster_gateway) -> None:
    for path, expected in (("/ai/400", AI_GATEWAY_400), ("/ai/422", AI_GATEWAY_422)):
        status, headers, body = _get(cluster_gateway, path)
        assert (status, headers["content-type"]) == (int(path[-3:]), "application/json")
        assert json.loads(body) == json.loads(expected)


def test_retry_after_is_the_reset_of_the_limit_that_refused(cluster_gateway) -> None:
    """The minute's request budget says its window's rest, the hour's token budget its own; a 429
    without x-ratelimit-reset keeps CLUSTER_RETRY_AFTER_S."""
    for path, expected in (("/limit/minute", MINUTE_RESET_S), ("/limit/hour", HOUR_RESET_S),
                           ("/limit/plain", CLUSTER_RETRY_AFTER_S)):
        status, headers, body = _get(cluster_gateway, path)
        assert status == 429 and headers["retry-after"] == str(expected), path
        assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"


def test_without_the_json_condition_envoys_own_400_stays_text() -> None:
    """What the cluster had: pass-through mappers on the status alone (the first matching mapper
    wins) leave Envoy's own 400 as Envoy wrote it, and the 429 said 60 s for the hour's budget too."""
    old = local_reply_config(CLUSTER_RETRY_AFTER_S)
    old["mappers"][:0] = [{"filter": {"status_code_filter": {"comparison": {
        "op": "EQ", "value": {"default_value": s, "runtime_key": f"old_{s}"}}}}} for s in AI_GATEWAY_JSON_STATUSES]
    with _gateway(old) as gw:
        status, headers, body = _get(gw, "/plain/400")
        assert status == 400 and headers.get("content-type") != "application/json"
        assert body == b"the request body is not valid JSON"
        status, headers, _ = _get(gw, "/limit/hour")
        assert status == 429 and headers["retry-after"] == str(CLUSTER_RETRY_AFTER_S)
