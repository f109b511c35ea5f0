"""Bearer keys to callers: the admin key, or a tenant's key checked against the registry store.

Keys are compared by their SHA-256 digests with `hmac.compare_digest` (constant time, and
the same length whatever was sent), and this replica remembers a verified tenant key only
by its digest. A remembered key is trusted for `cache_seconds`, then checked again; change
events (a rotated key, a deleted tenant) forget it at once. While the store is unreachable
remembered keys keep working (the tenants already known keep being served), and a key never
seen before gets 503: it cannot be told apart from a wrong one until the store is back.

Every refusal is the same 401 ("invalid or missing API key"), so nothing hints whether a
key was malformed, unknown, revoked, or belongs to a deleted tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from loragate.gateway.errors import (
    TGI_PATHS,
    APIError,
    AuthenticationError,
    ErrorDetail,
    ErrorResponse,
    RegistryDownError,
    tgi_error_body,
)
from loragate.gateway.registry_seam import RegistrySeam
from loragate.gateway.tenancy.principal import CALLER_SCOPE_KEY, OPERATOR, Principal
from loragate.registry import TenantRecord
from loragate.registry.api_keys import parse_api_key

# Load balancers probe this without credentials; it tells nothing about tenants or keys.
# /dashboard is a static page: the data it polls (/dashboard/data) needs the admin key.
UNAUTHENTICATED_PATHS = frozenset({"/health", "/dashboard"})

_INVALID = "invalid or missing API key: send `Authorization: Bearer <key>`"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass
class _Verified:
    tenant: str
    at: float


class Authenticator:
    def __init__(
        self,
        admin_key: str | None,
        store: RegistrySeam,
        cache_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        api_key: str | None = None,
        check_for_reset: Callable[[], Awaitable[None]] | None = None,
    ):
        """`check_for_reset`: makes sure a store that lost its data has been noticed (the
        registry sync's `resync`), before an unknown key is refused."""
        self.enabled = admin_key is not None
        self._admin = _digest(admin_key) if admin_key is not None else None
        # vLLM's --api-key: one shared key on a server without tenancy.
        self._shared = _digest(api_key) if api_key is not None and admin_key is None else None
        self._store = store
        self._health = store.health
        self._ttl = cache_seconds
        self._clock = clock
        self._keys: dict[bytes, _Verified] = {}
        self._tenants: dict[str, TenantRecord] = {}
        self._changes = 0
        self.orphans: set[str] = set()
        self.check_for_reset = check_for_reset

    def is_operator(self, authorization: str | None) -> bool:
        """Whether this header carries the admin key (always, on a server without tenancy).
        Never asks the store, so a route open to anyone can use it freely."""
        if not self.enabled:
            return self._shared is None or self._has_shared_key(authorization)
        token = bearer_token(authorization)
        return token is not None and hmac.compare_digest(_digest(token), self._admin)

    def _has_shared_key(self, authorization: str | None) -> bool:
        token = bearer_token(authorization)
        return token is not None and hmac.compare_digest(_digest(token), self._shared)

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind an Authorization header; AuthenticationError (401) otherwise."""
        if not self.enabled:
            if self._shared is not None and not self._has_shared_key(authorization):
                raise AuthenticationError(_INVALID, code="invalid_api_key")
            return OPERATOR
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationError(_INVALID, code="invalid_api_key")
        digest = _digest(token)
        if hmac.compare_digest(digest, self._admin):
            return OPERATOR
        if parse_api_key(token) is None:
            raise AuthenticationError(_INVALID, code="invalid_api_key")
        tenant = await self._tenant_of(token, digest)
        record = self._tenants[tenant]
        return Principal(
            tenant, record.quota, record.weight, cache_salt=f"{tenant}@{record.created_at!r}"
        )

    async def _tenant_of(self, token: str, digest: bytes) -> str:
        known = self._keys.get(digest)
        if known is not None and known.tenant not in self._tenants:
            known = None
        now = self._clock()
        if known is not None and (now - known.at < self._ttl or self._health.down):
            return known.tenant
        if self._health.down:
            raise RegistryDownError()
        changes = self._changes
        try:
            tenant = await self._store.verify_api_key(token)
            record = await self._store.get_tenant(tenant) if tenant is not None else None
        except RegistryDownError:
            if known is not None:
                return known.tenant
            raise
        if record is None and known is not None and self.check_for_reset is not None:
            # A key that was valid is unknown now: revoked (with its event missed), or the
            # store lost its data. Let the store's reset marker tell, before refusing.
            try:
                await self.check_for_reset()
            except RegistryDownError:
                return known.tenant
        if record is None:
            if known is not None and known.tenant in self.orphans:
                known.at = now  # the store lost its data; keep serving who we knew
                return known.tenant
            self._keys.pop(digest, None)
            raise AuthenticationError(_INVALID, code="invalid_api_key")
        if changes == self._changes:  # no change event arrived while we asked the store
            self._keys[digest] = _Verified(record.name, now)
            self._tenants[record.name] = record
        elif record.name not in self._tenants:
            self._tenants[record.name] = record
        return record.name

    # ---- what change events and resyncs tell it ----------------------------------------
    def forget_tenant(self, name: str) -> None:
        """The tenant was created, changed (quota, keys) or deleted: check its keys again."""
        self._changes += 1
        for digest in [d for d, v in self._keys.items() if v.tenant == name]:
            del self._keys[digest]
        self._tenants.pop(name, None)
        self.orphans.discard(name)

    def recheck_all(self) -> None:
        """Change events may have been missed: check every remembered key on its next use
        (while the store is down, they still work)."""
        self._changes += 1
        for verified in self._keys.values():
            verified.at = float("-inf")

    def orphan_everything(self) -> int:
        """The store lost its data: the tenants known here stay known until re-created."""
        self.orphans = set(self._tenants)
        return len(self.orphans)


class AuthGate:
    """ASGI middleware on every route: sets the caller, or answers 401/503 itself.

    It answers before any route code or body parsing runs: in TGI's error shape on the TGI
    routes (the lorax and text-generation clients parse only that), OpenAI's elsewhere.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in UNAUTHENTICATED_PATHS:
            return await self.app(scope, receive, send)
        authenticator: Authenticator = scope["litestar_app"].state.services.auth
        try:
            caller = await authenticator.authenticate(_header(scope, b"authorization"))
        except APIError as exc:
            return await _send_error(send, exc, tgi=scope["path"] in TGI_PATHS)
        scope[CALLER_SCOPE_KEY] = caller
        return await self.app(scope, receive, send)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _send_error(send, exc: APIError, tgi: bool = False) -> None:
    """In the OpenAI shape, or TGI's on the TGI routes (whose clients parse only that)."""
    error = ErrorResponse(
        error=ErrorDetail(message=exc.message, type=exc.error_type, code=exc.code)
    )
    body = msgspec.json.encode(tgi_error_body(exc.status_code, exc.message) if tgi else error)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if isinstance(exc, AuthenticationError):
        headers.append((b"www-authenticate", b"Bearer"))
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
