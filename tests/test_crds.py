"""`make crds` (gennstack/crds.py): the pinned upstream CRDs are the ones the tests validate against.

Offline: the pinned schema digests are checked against the CRD folder the suite uses
(``../shared/crds`` here; ``build/crds`` after `make crds`). The digests of the downloaded bytes
were computed from each file at its tag in a mirror of the upstream repository (``git show
TAG:PATH``); raw.githubusercontent.com cannot be reached from this machine, so the download
itself runs here against a local HTTP server.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import yaml

from gennstack import versions
from gennstack.crds import CRD_SOURCES, CrdError, CrdSource, fetch_all, schema_digest
from tests.k8s_schema import crd_dir
from tests.support import ROOT


def test_the_pins_are_the_crds_the_tests_validate_against() -> None:
    folder = crd_dir()
    on_disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.yaml"))
    assert sorted(s.file for s in CRD_SOURCES) == on_disk
    for source in CRD_SOURCES:
        crd = yaml.safe_load((folder / source.file).read_text(encoding="utf-8"))
        group, kind = source.file.removesuffix(".yaml").split("/")
        assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind), source.file
        assert schema_digest(crd) == source.schema_sha256, f"{source.file}: not the schema pinned in gennstack/crds.py"


def test_each_crd_comes_from_the_release_versions_py_pins() -> None:
    tags = {s.repo: s.tag for s in CRD_SOURCES}
    assert tags == {
        "ray-project/kuberay": f"v{versions.KUBERAY_OPERATOR.version}",
        "aws/karpenter-provider-aws": f"v{versions.KARPENTER_CRD.version}",
        "kubernetes-sigs/gateway-api": versions.GATEWAY_API_VERSION,
        "envoyproxy/gateway": versions.ENVOY_GATEWAY.version,
        "envoyproxy/ai-gateway": versions.AI_GATEWAY_CRDS.version,
        "kubernetes-sigs/lws": f"v{versions.LWS.version}",
        "external-secrets/external-secrets": f"v{versions.EXTERNAL_SECRETS.version}",
        "kedacore/keda": f"v{versions.KEDA.version}",
        "prometheus-operator/prometheus-operator": versions.PROMETHEUS_OPERATOR_VERSION,
        "kubernetes-sigs/gateway-api-inference-extension": versions.INFERENCE_EXTENSION_VERSION,
    }
    assert CRD_SOURCES[0].url() == ("https://raw.githubusercontent.com/ray-project/kuberay/v1.7.0/"
                                    "helm-chart/kuberay-operator/crds/ray.io_rayservices.yaml")


def test_schema_digest_ignores_descriptions_metadata_and_formatting() -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "things.example.com", "annotations": {"a": "b"}},
           "spec": {"group": "example.com", "versions": [{"name": "v1", "schema": {"openAPIV3Schema": {
               "type": "object", "description": "a thing",
               "properties": {"description": {"type": "string", "description": "a field named description"}}}}}]},
           "status": {"storedVersions": None}}
    trimmed = yaml.safe_load(yaml.safe_dump(crd, width=40))
    trimmed["metadata"] = {"name": "things.example.com"}
    del trimmed["status"], trimmed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
    assert schema_digest(trimmed) == schema_digest(crd)
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["description"]["type"] = "integer"
    assert schema_digest(trimmed) != schema_digest(crd)


TINY = b"""apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.example.com
  annotations: {controller-gen.kubebuilder.io/version: v0.18.0}
spec:
  group: example.com
  names: {kind: Thing, plural: things}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, description: A thing.}
"""


@pytest.fixture
def server(tmp_path: Path):
    root = tmp_path / "www"
    (root / "example" / "things" / "v1.0.0" / "crds").mkdir(parents=True)
    (root / "example" / "things" / "v1.0.0" / "crds" / "things.yaml").write_bytes(TINY)
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _source(sha: str) -> CrdSource:
    return CrdSource("example.com/Thing.yaml", "example/things", "v1.0.0", "crds/things.yaml", sha,
                     schema_digest(yaml.safe_load(TINY)))


def test_fetch_writes_the_checked_file_where_the_tests_look(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "crds"
    written = fetch_all(dest, [_source(hashlib.sha256(TINY).hexdigest())], base=server)
    assert written == [dest / "example.com" / "Thing.yaml"] and written[0].read_bytes() == TINY


def test_fetch_refuses_a_file_that_is_not_the_pinned_one(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "crds"
    with pytest.raises(CrdError, match=r"example.com/Thing.yaml: http://127.0.0.1:\d+/example/things/v1.0.0/crds/things.yaml "
                                       r"has SHA-256 [0-9a-f]{64}, pinned 0{64}"):
        fetch_all(dest, [_source("0" * 64)], base=server)
    missing = CrdSource("example.com/Other.yaml", "example/things", "v1.0.0", "crds/none.yaml", "0" * 64, "0" * 64)
    with pytest.raises(CrdError, match="example.com/Other.yaml: could not fetch .*none.yaml"):
        fetch_all(dest, [missing], base=server)
    assert not dest.exists()


def test_make_crds_runs_the_fetcher() -> None:
    assert "crds: $(VENV)/.installed\n\t$(PY) -m gennstack.crds\n" in (ROOT / "Makefile").read_text(encoding="utf-8")
