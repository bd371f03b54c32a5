"""The repo's constructs/ folder merges into the `constructs` library instead of shadowing it."""

from __future__ import annotations

from pathlib import Path

import constructs
from tests.support import ROOT

LIBRARY_MODULES = {"_jsii"}


def test_constructs_folder_has_no_init() -> None:
    # An __init__.py would make constructs/ a regular package that shadows the library,
    # and `from constructs import Construct` would fail in every CDK module.
    assert not (ROOT / "constructs" / "__init__.py").exists()


def test_library_and_project_modules_both_import() -> None:
    from constructs import Construct  # the library class
    from constructs.model_storage import ModelStorage
    from constructs.network import Network

    assert Construct.__module__.startswith("constructs")
    assert str(ROOT / "constructs") in list(constructs.__path__)
    assert Network.__module__ == "constructs.network"
    assert ModelStorage.__module__ == "constructs.model_storage"


def test_project_modules_do_not_collide_with_library_modules() -> None:
    library_dir = next(p for p in constructs.__path__ if "site-packages" in p)
    library = {p.stem for p in Path(library_dir).iterdir()}
    ours = {p.stem for p in (ROOT / "constructs").glob("*.py")}
    assert not ours & (library | LIBRARY_MODULES), ours & library
