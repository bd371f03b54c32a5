"""Native sidecar: removes the pod's `karpenter.sh/do-not-disrupt` annotation once its model
server answers its health check, so Karpenter leaves a node alone while a model is loading (a
disruption then would throw away minutes of loading) and treats it normally afterwards.

Talks to the Kubernetes API with the pod's ServiceAccount token: a Role allows `patch` on pods in
this namespace, and the chart's ValidatingAdmissionPolicy narrows that to removing this annotation
from the pod the token is bound to. Then idles: a sidecar that exits is restarted.

    env: HEALTH_URL POD_NAME; SERVICE_ACCOUNT_DIR (default: where Kubernetes mounts the token)
"""

import json
import os
import ssl
import time
import urllib.request

ACCOUNT = os.environ.get("SERVICE_ACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
ANNOTATION = "karpenter.sh/do-not-disrupt"


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def release(pod: str) -> None:
    with open(f"{ACCOUNT}/token") as token, open(f"{ACCOUNT}/namespace") as namespace:
        bearer, ns = token.read().strip(), namespace.read().strip()
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/namespaces/{ns}/pods/{pod}",
        method="PATCH",
        data=json.dumps({"metadata": {"annotations": {ANNOTATION: None}}}).encode(),
        headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/merge-patch+json"},
    )
    context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")
    with urllib.request.urlopen(request, context=context, timeout=10):
        pass


def main() -> None:
    url, pod = os.environ["HEALTH_URL"], os.environ["POD_NAME"]
    while not healthy(url):
        time.sleep(10)
    for attempt in range(30):
        try:
            release(pod)
            print(f"model server healthy: removed {ANNOTATION} from {pod}", flush=True)
            break
        except OSError as exc:
            print(f"could not patch {pod} ({exc}); retrying", flush=True)
            time.sleep(10)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
