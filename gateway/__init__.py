"""loragate.gateway: the HTTP API (Litestar + msgspec), in parts by concern, each importing
only those before it: errors and the registry seam, tenancy/ (see TENANCY.md),
adapter_control/, serving/ (the served model, a request's accounting, admission), the
openai/, tgi/ and admin/ protocols, settings, registry_care/ (persistence, backups, export
and import), replicas/, observation/ (metrics, the dashboard, /health, logs) and assembly/
(the app factory and its services, the CLI, server start).

Importing the package imports nothing else: the app is `loragate.gateway.assembly.app`, the
server `loragate.gateway.assembly.server`, the settings `loragate.gateway.settings`."""

import os

# The server sets how long OpenMP workers spin before sleeping before torch loads libgomp,
# which reads it once (loragate.engine does the same for the offline API), unless the
# environment already says.
os.environ.setdefault("GOMP_SPINCOUNT", "50000")
