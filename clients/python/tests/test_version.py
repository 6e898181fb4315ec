"""The version has one home, `kernelbox_client.__version__`: the installed package's metadata
(pyproject.toml's dynamic version) is read from it."""

from __future__ import annotations

from importlib.metadata import version

import kernelbox_client


def test_the_installed_version_is_the_modules() -> None:
    assert version("kernelbox-client") == kernelbox_client.__version__
