"""Both Redis images: one pinned patch release, past the fix of CVE-2025-49844, everywhere they are set.

docker-library/official-images library/redis at 37079fb (2026-08-21) lists the 7.4 line as
``Tags: 7.4.11, 7.4, 7, 7.4.11-bookworm, ...`` and ``Tags: 7.4.11-alpine, 7.4-alpine, ...``.
CVE-2025-49844 (a Lua use-after-free: remote code execution for any client that may EVAL) is fixed
in 7.4.6 (redis.io security advisory; unverified here beyond third-party summaries).
"""

from __future__ import annotations

import re

import yaml

from gennstack import versions
from tests.support import ROOT

OFFICIAL_7_4 = {"7.4.11", "7.4.11-alpine"}  # the 7.4 patch tags at 37079fb


def _tag(image: str) -> str:
    repository, tag = image.rsplit(":", 1)
    assert repository == "docker.io/library/redis", image
    return tag


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.match(r"^(\d+)\.(\d+)\.(\d+)", tag).groups())


def test_pinned_redis_images_are_official_patched_releases() -> None:
    for image in (versions.REDIS_IMAGE, versions.REDIS_ALPINE_IMAGE):
        assert _tag(image) in OFFICIAL_7_4
        assert _version(_tag(image)) >= (7, 4, 6), f"{image} predates the CVE-2025-49844 fix"


def test_charts_and_cdk_use_the_pinned_images() -> None:
    gateway = yaml.safe_load((ROOT / "assets/charts/gennstack-gateway/values.yaml").read_text())
    serving = yaml.safe_load((ROOT / "assets/charts/gennstack-serving/values.yaml").read_text())
    assert gateway["redis"]["image"] == versions.REDIS_ALPINE_IMAGE
    assert serving["images"]["redis"] == versions.REDIS_IMAGE
