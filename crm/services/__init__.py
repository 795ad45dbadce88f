"""CRM writes: contacts, identities, consent, erasure, segments and CSV imports.

The public actions live in ``contacts``, ``segments`` and ``imports`` and are
re-exported here, so ``from crm.services import contact_create`` is the way to
call them. Every function takes the tenant first, the rest keyword-only,
validates its input (``ValidationError`` names the field path) and only then
writes through the store.
"""

from __future__ import annotations

from crm.domain import CHANNELS

from .contacts import (
    ErasureReport,
    consent_set,
    contact_blocked_us,
    contact_create,
    contact_erase,
    contact_tags_add,
    contact_tags_remove,
    contact_update,
    contact_upsert_identity,
    erase,
    identity_hash,
)
from .imports import contact_import_dead_lettered, contact_import_queue, contact_import_run, contact_import_start
from .segments import (
    SegmentInUse,
    segment_create,
    segment_delete,
    segment_membership_build,
    segment_membership_sync,
    segment_update,
)

__all__ = [
    "CHANNELS",
    "ErasureReport",
    "SegmentInUse",
    "consent_set",
    "contact_blocked_us",
    "contact_create",
    "contact_erase",
    "contact_import_dead_lettered",
    "contact_import_queue",
    "contact_import_run",
    "contact_import_start",
    "contact_tags_add",
    "contact_tags_remove",
    "contact_update",
    "contact_upsert_identity",
    "erase",
    "identity_hash",
    "segment_create",
    "segment_delete",
    "segment_membership_build",
    "segment_membership_sync",
    "segment_update",
]
