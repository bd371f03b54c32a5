"""Shared fixtures. The app is synthesized once per test session (a synth costs seconds)."""

from __future__ import annotations

import pytest

from tests.support import VARIANT, Synth, synthesize


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The default GenNStack, as `make synth` builds it."""
    return synthesize(tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def synth_variant(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """GenNStack with every non-default branch taken (see VARIANT)."""
    return synthesize(tmp_path_factory.mktemp("cdk-variant"), VARIANT)


@pytest.fixture(scope="session")
def any_synth_pair(synth: Synth, synth_variant: Synth) -> tuple[Synth, Synth]:
    """Both synths, for assertions that must hold whatever the config."""
    return synth, synth_variant
