"""The pluggy markers of the ``loragate`` project name.

Kept apart from the specs so built-in plugins and third-party plugins import the same
``hookimpl`` without pulling in the manager.
"""

import pluggy

PROJECT_NAME = "loragate"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
