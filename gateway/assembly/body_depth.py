"""Request bodies nested deeper than `MAX_JSON_DEPTH` are a 400 before any parser sees them.

msgspec (like Python's json) recurses once per level and ends in RecursionError a thousand
or so levels down: a 500 with a traceback per request. Litestar reads every body through
`Request.body()`, so checking there covers every route, the TGI ones included.
"""

from __future__ import annotations

from litestar import Request

from loragate.adapters.json_depth import MAX_JSON_DEPTH, too_deep
from loragate.gateway.errors import InvalidRequestError

_CHECKED = "loragate.body_depth_checked"


class DepthCheckedRequest(Request):
    async def body(self) -> bytes:
        body = await super().body()
        if not self.scope.get(_CHECKED):
            if too_deep(body):
                raise InvalidRequestError(
                    f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
                    code="too_deeply_nested",
                )
            self.scope[_CHECKED] = True  # type: ignore[typeddict-unknown-key]
        return body
