"""Fake installed distributions, so entry-point discovery is tested without pip."""

from __future__ import annotations

import importlib
import textwrap

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
