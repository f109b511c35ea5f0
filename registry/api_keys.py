"""API keys: issued once in clear, stored only as a salted hash, checked in constant time.

A key reads `lg-<key_id>-<secret>`. The key_id (16 hex digits) is not secret: it finds the
stored hash in one lookup and may be shown to admins. The secret carries 256 random bits,
so one HMAC-SHA256 with a per-key salt is enough: guessing it is hopeless, and unlike a
slow password hash (scrypt) it costs microseconds on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

import msgspec

KEY_PREFIX = "lg-"
_KEY = re.compile(r"lg-([0-9a-f]{16})-([A-Za-z0-9_-]{43})")
_DUMMY_SALT = bytes(16)


class StoredKey(msgspec.Struct, frozen=True):
    """What the store keeps for one key: never the secret itself."""

    key_id: str
    tenant: str
    salt: str
    digest: str


def _digest(salt: bytes, secret: str) -> bytes:
    return hmac.new(salt, secret.encode(), hashlib.sha256).digest()


def issue_api_key(tenant: str) -> tuple[str, StoredKey]:
    """A new key for `tenant`: (the key in clear, to hand out once; what to store)."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    stored = StoredKey(key_id, tenant, salt.hex(), _digest(salt, secret).hex())
    return f"{KEY_PREFIX}{key_id}-{secret}", stored


def parse_api_key(api_key: object) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed key, else None."""
    if not isinstance(api_key, str):
        return None
    match = _KEY.fullmatch(api_key)
    return (match.group(1), match.group(2)) if match else None


def secret_matches(stored: StoredKey | None, secret: str) -> bool:
    """Whether `secret` is the one `stored` was made from, in constant time.

    With no stored key it still hashes and compares (against nothing that can match),
    so an unknown key_id takes as long as a wrong secret.
    """
    if stored is None:
        salt, expected = _DUMMY_SALT, bytes(32)
    else:
        salt, expected = bytes.fromhex(stored.salt), bytes.fromhex(stored.digest)
    equal = hmac.compare_digest(_digest(salt, secret), expected)
    return equal and stored is not None
