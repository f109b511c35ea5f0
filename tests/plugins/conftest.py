"""Fake installed distributions, so entry-point discovery is tested without pip."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def install_fake_plugin(tmp_path, monkeypatch):
    """``install(dist, {ep_name: "module:object"}, modules={name: source})``: a dist-info
    folder on sys.path that importlib.metadata finds, plus the modules it points at."""
    monkeypatch.delenv("LORAGATE_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(dist: str, entry_points: dict[str, str], modules: dict[str, str] = {}):  # noqa: B006
        info = tmp_path / f"{dist}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[loragate.plugins]\n{lines}")
        for module, source in modules.items():
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()

    return install


EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "plugins"


@pytest.fixture(scope="session")
def example_plugin_site(tmp_path_factory) -> Path:
    """examples/plugins pip-installed (a real wheel build) into a private folder.

    Not into the shared venv: an installed plugin loads in every engine that reads entry
    points, and its eviction policy would replace LRU for every other test.
    """
    source = tmp_path_factory.mktemp("example-src") / "plugins"
    shutil.copytree(EXAMPLE_PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    site = tmp_path_factory.mktemp("example-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return site


@pytest.fixture
def example_plugin_installed(example_plugin_site, monkeypatch) -> Path:
    """The installed example on sys.path, as if pip had put it in site-packages."""
    monkeypatch.delenv("LORAGATE_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(example_plugin_site))
    yield example_plugin_site
    sys.modules.pop("loragate_example_plugin", None)
