"""The installed package holds every subpackage: a wheel missing one imports nowhere but in an
editable checkout (`loragate.plugins.builtin` was missing once, found on the first GPU run)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_for_setuptools():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, folders = set(setuptools["packages"]), setuptools["package-dir"]
    found = set()
    for package, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    for package in listed:
        parent = max((p for p in folders if package.startswith(p)), key=len)
        rest = package[len(parent) :].lstrip(".").split(".") if package != parent else []
        assert (ROOT / folders[parent]).joinpath(*rest, "__init__.py").is_file(), package
