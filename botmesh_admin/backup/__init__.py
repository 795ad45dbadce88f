"""Backups and restores of a whole installation (``manage.py backup`` / ``manage.py restore``).

A backup is a directory (or a ``.tar`` / ``.tar.gz`` of one) holding
``manifest.json`` and one file per *part*: the Django database, the DurableKv
and the event journal, each copied the way its backend allows while the
installation keeps running:

==============  =============================================================
SQLite          the online backup API (``sqlite3.Connection.backup``): a consistent
                snapshot of the file, taken while other processes write
PostgreSQL      ``pg_dump --format=custom`` (one snapshot of the database); a Kv or
                journal in the same database travels inside that dump, one in
                another database gets a dump of its own tables
file://         the snapshot file (FileKv, FileEventJournal replace it atomically,
                so a read sees a whole snapshot)
Redis, memory   a logical export: every Kv table (``tables()`` + ``scan``) or every
                journal record (``export_records``), with versions, expiry times,
                states and the fencing counter
==============  =============================================================

The manifest names the format version, the schema (the latest applied migration
of every app), the creation time, the backends and a SHA-256 per file. A
restore checks all of it before it touches anything: a backup written by a
newer schema is refused, naming the app and the migration.

Not in a backup: the Celery broker's queued messages, coordination leases and
turns, process counters (all rebuilt at start), and the keys (``SECRET_KEY``,
``BOTMESH_CREDENTIALS_KEYS``): keep those in your secret store, a restore needs
them to read the channel credentials back.
"""

from __future__ import annotations

from .manifest import FORMAT, FORMAT_VERSION, BackupError
from .services import backup_create, backup_restore

__all__ = ["FORMAT", "FORMAT_VERSION", "BackupError", "backup_create", "backup_restore"]
