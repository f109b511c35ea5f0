"""pytest plugin (-p mutant_plugin): applies the mutant named in LORAGATE_MUTANT at start."""

from __future__ import annotations

import os

from mutants import BY_NAME, apply

NAME = os.environ.get("LORAGATE_MUTANT", "")


def pytest_configure(config):
    if NAME:
        apply(BY_NAME[NAME])


def pytest_report_header(config):
    return f"engine mutant: {NAME or 'none'}"
