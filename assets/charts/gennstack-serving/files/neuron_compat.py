"""The node's Neuron driver and the image's Neuron runtime: read both, and refuse a pair upstream says fails.

Imported by s3sync.py's pull (the init container sync-from-s3 of every Neuron serving pod and compile
Job), which logs both versions and stops before the copy and the long load when the pair is a known-bad
one: the runtime would only fail later, at ``nrt_init()``, after hundreds of GB copied and the load begun.

* The driver: the ``neuron`` kernel module's ``MODULE_VERSION`` (aws-neuron/aws-neuron-driver
  ``neuron_module.c``: ``MODULE_VERSION("2.24.7.0")``), which the kernel exposes as
  ``/sys/module/neuron/version``. /sys/module is the host's in every container (sysfs, mounted read
  only), so the init container reads the running driver without a device or privileges. (``modinfo``
  would read the installed ``neuron.ko`` instead, which after an upgrade without a reload is not the
  loaded one: aws-neuron-sdk ``neuron-runtime/nrt-troubleshoot.rst``.)
* The runtime: the ``aws-neuronx-runtime-lib`` package in the image's dpkg database; the Neuron vLLM
  DLC installs it with apt (aws-neuron/deep-learning-containers 2.28.0,
  ``vllm/inference/0.13.0/Dockerfile.neuronx``: ``aws-neuronx-runtime-lib=$NEURONX_RUNTIME_LIB_VERSION``,
  ``2.30.51.0-faafe26f0``).

The rules are upstream's own, read in aws-neuron/aws-neuron-sdk ``release-notes/components/runtime.rst``
(v2.31.0 and v2.32.0). Otherwise "The driver remains backwards compatible with older versions of Neuron
Runtime" (``neuron-runtime/nrt-troubleshoot.rst``, v2.31.0).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DRIVER_FILE = Path("/sys/module/neuron/version")
DPKG_STATUS = Path("/var/lib/dpkg/status")
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"

Version = tuple[int, ...]


@dataclass(frozen=True)
class Rule:
    """A driver/runtime pair that fails: ``driver`` within [driver_from, driver_to) and ``runtime``
    within [runtime_from, runtime_to) (a None bound is open)."""

    driver_from: Version | None
    driver_to: Version | None
    runtime_from: Version | None
    runtime_to: Version | None
    upstream: str

    def matches(self, driver: Version, runtime: Version) -> bool:
        return (_within(driver[:2], self.driver_from, self.driver_to)
                and _within(runtime[:2], self.runtime_from, self.runtime_to))


def _within(version: Version, low: Version | None, high: Version | None) -> bool:
    return (low is None or version >= low) and (high is None or version < high)


KNOWN_BAD: tuple[Rule, ...] = (
    # runtime.rst, "Neuron Runtime (Neuron 2.31.0 Release)", Neuron Driver 2.29, Known Issues.
    Rule((2, 29), (2, 30), None, (2, 33),
         "aws-neuron-sdk release-notes/components/runtime.rst (Neuron 2.31.0, Neuron Driver 2.29, Known Issues): "
         "\"Neuron Driver 2.29 requires Neuron Runtime Library 2.33 or later. Upgrading the Driver without also "
         "upgrading the Runtime Library will cause nrt_init() to fail.\""),
    # runtime.rst, "Neuron Runtime (Neuron 2.30.0 Release)", Neuron Runtime Library 2.32, Known Issues.
    Rule(None, (2, 27), (2, 32), (2, 33),
         "aws-neuron-sdk release-notes/components/runtime.rst (Neuron 2.30.0, Neuron Runtime Library 2.32, Known "
         "Issues): \"Neuron Runtime Library 2.32 is not backward-compatible with Neuron Driver 2.26 or earlier. "
         "Applications that upgrade the Runtime without also upgrading the Driver will fail to initialize.\""),
)


class IncompatibleNeuron(Exception):
    """The node's driver cannot run the image's runtime; the message names both and upstream's text."""


def parse(version: str) -> Version:
    """``2.30.51.0-faafe26f0`` or ``2.28.0.0`` as ``(2, 30, 51, 0)``; ValueError when it starts with no
    ``major.minor``."""
    match = re.match(r"\s*(\d+(?:\.\d+)+)", version)
    if not match:
        raise ValueError(f"not a Neuron version: {version!r}")
    return tuple(int(p) for p in match.group(1).split("."))


def driver_version(path: Path = DRIVER_FILE) -> str | None:
    """The loaded ``neuron`` module's version, or None where none is loaded (or /sys is not readable)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def runtime_version(status: Path = DPKG_STATUS, package: str = RUNTIME_PACKAGE) -> str | None:
    """The installed ``package``'s Version from a dpkg status file, or None where it is not installed."""
    try:
        text = status.read_text(errors="replace")
    except OSError:
        return None
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, flags=re.MULTILINE))
        if fields.get("Package") == package and "installed" in fields.get("Status", "").split():
            return fields.get("Version") or None
    return None


def incompatibility(driver: str, runtime: str) -> str | None:
    """Why Neuron driver ``driver`` cannot run runtime ``runtime`` (upstream's text), or None when no known
    rule refuses the pair."""
    d, r = parse(driver), parse(runtime)
    for rule in KNOWN_BAD:
        if rule.matches(d, r):
            return rule.upstream
    return None


def check(log: Callable[[str], None] = print, driver_file: Path = DRIVER_FILE, dpkg_status: Path = DPKG_STATUS) -> None:
    """Log the node's driver and the image's runtime; raise IncompatibleNeuron for a known-bad pair.
    A version that cannot be read is logged and passes: only a pair upstream names is refused."""
    driver, runtime = driver_version(driver_file), runtime_version(dpkg_status)
    log(f"Neuron driver on this node: {driver or f'unknown (no {driver_file})'}; Neuron runtime in this image: "
        f"{runtime or f'unknown (no {RUNTIME_PACKAGE} in {dpkg_status})'}")
    if driver is None or runtime is None:
        return
    try:
        why = incompatibility(driver, runtime)
    except ValueError as exc:
        log(f"cannot compare the Neuron versions: {exc}")
        return
    if why:
        raise IncompatibleNeuron(
            f"the node's Neuron driver {driver} cannot run this image's Neuron runtime {runtime}, so the server would "
            f"fail at load: {why} Run these pods on nodes of the AMI release gennstack/versions.py NEURON_AMI_ALIAS pins "
            f"(or an image whose runtime this driver accepts).")
