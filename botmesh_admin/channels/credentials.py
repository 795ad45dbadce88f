"""Channel secrets at rest: encrypted when needed in clear later, hashed when only checked.

- Encrypted (WhatsApp app secret for the HMAC, access token, Telegram bot token):
  ``cryptography``'s ``MultiFernet`` over the keys in ``BOTMESH_CREDENTIALS_KEYS``
  (``settings.CONFIG.credentials_keys``, newest first). A key is either a Fernet
  key (32 url-safe base64 bytes) or any passphrase, stretched with HKDF-SHA256.
  A key derived from ``SECRET_KEY`` (then one per ``SECRET_KEY_FALLBACKS``) always
  comes last, so values written before keys were configured, or before the
  secret key was rotated, stay readable. Encryption uses the first key; decryption
  tries every key, so adding a new key in front keeps old values decryptable
  (and ``channel_credentials_rotate`` re-encrypts them with the new key).
- Hashed (WhatsApp verify token, Telegram webhook secret token): salted SHA-256,
  ``"sha256$<salt hex>$<digest hex>"``, compared in constant time. These are
  random tokens the admin generates (the UI proposes one), not passwords, so a
  fast hash is enough and keeps the per-webhook check cheap.

Nothing here logs a value.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets as _secrets

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from botmesh_admin.errors import DomainError

HKDF_INFO = b"botmesh-admin channel credentials v1"
HASH_SCHEME = "sha256"


class CredentialUnreadable(DomainError):
    """A stored credential cannot be decrypted with any configured key (a key was removed). HTTP 503."""

    code = "credential_unreadable"
    status = 503


def _derive(material: str) -> bytes:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(material.encode("utf-8"))
    return base64.urlsafe_b64encode(key)


def _as_fernet_key(key: str) -> bytes:
    try:
        if len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32:
            return key.encode("ascii")
    except (binascii.Error, ValueError, UnicodeEncodeError):
        pass
    return _derive(key)


@functools.lru_cache(maxsize=8)
def _multi_fernet(keys: tuple[str, ...], secret_key: str, old_secret_keys: tuple[str, ...] = ()) -> MultiFernet:
    fernet_keys = [_as_fernet_key(k) for k in keys]
    # Keys derived from SECRET_KEY and then SECRET_KEY_FALLBACKS: a value encrypted
    # before a SECRET_KEY rotation stays readable while the old key is a fallback.
    for secret in (secret_key, *old_secret_keys):
        fallback = _derive(secret)
        if fallback not in fernet_keys:
            fernet_keys.append(fallback)
    return MultiFernet([Fernet(k) for k in fernet_keys])


def keyring() -> MultiFernet:
    """Return the ``MultiFernet`` of the configured keys (read from settings at call time)."""
    from django.conf import settings

    return _multi_fernet(
        tuple(settings.CONFIG.credentials_keys),
        settings.SECRET_KEY,
        tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ())),
    )


def encrypt(plaintext: str) -> str:
    """Return ``plaintext`` encrypted with the newest key (a Fernet token, ASCII)."""
    return keyring().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    """Return the plaintext of ``token``; raise ``CredentialUnreadable`` if no key opens it."""
    try:
        return keyring().decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError):
        raise CredentialUnreadable(
            "a stored channel credential cannot be decrypted: was a key removed from BOTMESH_CREDENTIALS_KEYS?"
        ) from None


def reencrypt(token: str) -> str:
    """Return ``token`` re-encrypted with the newest key (``MultiFernet.rotate``)."""
    try:
        return keyring().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise CredentialUnreadable("a stored channel credential cannot be decrypted") from None


def secret_hash(value: str, *, salt: str | None = None) -> str:
    """Return ``"sha256$<salt>$<hex digest>"`` of ``value`` with a fresh random salt."""
    salt = salt if salt is not None else _secrets.token_hex(16)
    digest = hashlib.sha256(f"{salt}${value}".encode()).hexdigest()
    return f"{HASH_SCHEME}${salt}${digest}"


def secret_matches(value: str | None, stored: str | None) -> bool:
    """Return True if ``value`` hashes to ``stored`` (constant-time compare; False if either is empty)."""
    if not value or not stored:
        return False
    parts = stored.split("$")
    if len(parts) != 3 or parts[0] != HASH_SCHEME:
        return False
    return hmac.compare_digest(secret_hash(value, salt=parts[1]), stored)


def new_token(nbytes: int = 24) -> str:
    """Return a random URL-safe token (letters, digits, ``-`` and ``_``: valid for Telegram too)."""
    return _secrets.token_urlsafe(nbytes)
