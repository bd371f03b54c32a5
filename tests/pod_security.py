"""The Pod Security Standards' checks, for rendered pod specs, as kubernetes/pod-security-admission
v0.36.0 (the library the API server of Kubernetes 1.36 evaluates namespaces' labels with) defines them
in policy/check_*.go. No Go toolchain or API server is installed here, so each check is written out
from its file (named in its comment); ``violations`` returns the IDs upstream gives the failed checks.

Only the Linux checks a GenNStack pod can touch are written out; the Windows host-process check
(check_windowsHostProcess.go) cannot fail for a pod that sets no windowsOptions, which none does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# check_capabilities_baseline.go capabilities_allowed_1_0.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
# check_restrictedVolumes.go: the only inline volume sources restricted allows.
RESTRICTED_VOLUMES = {"configMap", "downwardAPI", "emptyDir", "projected", "secret", "csi", "persistentVolumeClaim",
                      "ephemeral", "image"}
# check_seLinuxOptions.go: the types baseline allows.
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every container of a pod spec (visitContainers: init, regular and ephemeral)."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def baseline(spec: dict[str, Any]) -> set[str]:
    pod = spec.get("securityContext") or {}
    failed: set[str] = set()
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        failed.add("hostNamespaces")  # check_hostNamespaces.go
    if any(_sc(c).get("privileged") for c in containers(spec)):
        failed.add("privileged")  # check_privileged.go
    if any(set((_sc(c).get("capabilities") or {}).get("add") or ()) - BASELINE_CAPABILITIES for c in containers(spec)):
        failed.add("capabilities_baseline")  # check_capabilities_baseline.go
    if any("hostPath" in v for v in spec.get("volumes") or ()):
        failed.add("hostPathVolumes")  # check_hostPathVolumes.go
    if any(p.get("hostPort") for c in containers(spec) for p in c.get("ports") or ()):
        failed.add("hostPorts")  # check_hostPorts.go
    if any(_sc(c).get("procMount") not in (None, "Default") for c in containers(spec)):
        failed.add("procMount")  # check_procMount_baseline.go
    profiles = [pod.get("seccompProfile")] + [_sc(c).get("seccompProfile") for c in containers(spec)]
    if any((p or {}).get("type") == "Unconfined" for p in profiles):
        failed.add("seccompProfile_baseline")  # check_seccompProfile_baseline.go
    apparmor = [pod.get("appArmorProfile")] + [_sc(c).get("appArmorProfile") for c in containers(spec)]
    if any((p or {}).get("type") == "Unconfined" for p in apparmor):
        failed.add("appArmorProfile")  # check_appArmorProfile.go
    selinux = [pod.get("seLinuxOptions")] + [_sc(c).get("seLinuxOptions") for c in containers(spec)]
    if any(o and (o.get("type", "") not in SELINUX_TYPES or o.get("user") or o.get("role")) for o in selinux):
        failed.add("seLinuxOptions")  # check_seLinuxOptions.go
    if pod.get("sysctls"):
        failed.add("sysctls")  # check_sysctls.go allows a list of safe ones; GenNStack sets none, so any is flagged
    handlers = [c.get(k) for c in containers(spec) for k in ("startupProbe", "readinessProbe", "livenessProbe")]
    handlers += [(c.get("lifecycle") or {}).get(k) for c in containers(spec) for k in ("postStart", "preStop")]
    if any((h or {}).get(kind, {}).get("host") for h in handlers for kind in ("httpGet", "tcpSocket")):
        failed.add("hostProbesAndHostLifecycle")  # check_hostProbesAndhostLifecycle.go
    return failed


def restricted(spec: dict[str, Any]) -> set[str]:
    pod = spec.get("securityContext") or {}
    failed = baseline(spec)
    if any(not set(v) - {"name"} <= RESTRICTED_VOLUMES for v in spec.get("volumes") or ()):
        failed.add("restrictedVolumes")  # check_restrictedVolumes.go
    if any(_sc(c).get("allowPrivilegeEscalation") is not False for c in containers(spec)):
        failed.add("allowPrivilegeEscalation")  # check_allowPrivilegeEscalation.go: must be set to false
    if spec.get("hostUsers") is not False:  # check_runAsNonRoot.go: any value in a user namespace
        nonroot = [_sc(c).get("runAsNonRoot") for c in containers(spec)]
        if False in nonroot or pod.get("runAsNonRoot") is False or (pod.get("runAsNonRoot") is not True and None in nonroot):
            failed.add("runAsNonRoot")
    if pod.get("runAsUser") == 0 or any(_sc(c).get("runAsUser") == 0 for c in containers(spec)):
        failed.add("runAsUser")  # check_runAsUser.go
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    for c in containers(spec):
        kind = (_sc(c).get("seccompProfile") or {}).get("type")
        if kind not in ("RuntimeDefault", "Localhost") and (kind is not None or pod_seccomp not in ("RuntimeDefault", "Localhost")):
            failed.add("seccompProfile_restricted")  # check_seccompProfile_restricted.go
    for c in containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()) or set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            failed.add("capabilities_restricted")  # check_capabilities_restricted.go
    return failed


def violations(spec: dict[str, Any], level: str) -> set[str]:
    """IDs of the checks of ``level`` (privileged, baseline or restricted) that ``spec`` fails."""
    return {"privileged": lambda _: set(), "baseline": baseline, "restricted": restricted}[level](spec)


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, pod spec)`` of every pod template among rendered objects: Deployments, Jobs, the
    RayService's head and worker groups and the LeaderWorkerSets' leader and worker templates."""
    for obj in objects:
        name, kind = obj["metadata"]["name"], obj["kind"]
        if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield name, obj["spec"]["template"]["spec"]
        elif kind == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            yield f"{name}/head", cluster["headGroupSpec"]["template"]["spec"]
            for group in cluster.get("workerGroupSpecs") or ():
                yield f"{name}/{group['groupName']}", group["template"]["spec"]
        elif kind == "LeaderWorkerSet":
            template = obj["spec"]["leaderWorkerTemplate"]
            if "leaderTemplate" in template:
                yield f"{name}/leader", template["leaderTemplate"]["spec"]
            yield f"{name}/worker", template["workerTemplate"]["spec"]
