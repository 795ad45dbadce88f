"""Manifest validation of untrusted JSON, runtime ranges and the shipped runtime data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from botmesh_admin.errors import ValidationError
from hub.domain import (
    DEFAULT_RUNTIME,
    MAX_MANIFEST_BYTES,
    current_runtime,
    parse_manifest,
    runtime_satisfies,
    validate_runtime_range,
)

from .conftest import RUNTIME

EXPECTED_FIELD = {
    "array_top_level.json": "manifest",
    "not_json.json": "manifest",
    "duplicate_permissions.json": "manifest.permissions[1]",
    "extra_huge_description.json": "manifest.description",
    "id_with_slash.json": "manifest.id",
    "name_is_number.json": "manifest.name",
    "permissions_not_list.json": "manifest.permissions",
    "proto_pollution.json": "manifest.__proto__",
    "runtime_range_garbage.json": "manifest.runtime",
    "unknown_permission.json": "manifest.permissions[1]",
    "version_not_semver.json": "manifest.version",
}

BASE = {"id": "x.y", "name": "Y", "version": "0.1.0", "runtime": "^1.0.0", "permissions": []}


def _refusal(body: object) -> ValidationError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ValidationError) as info:
        parse_manifest(raw, runtime=RUNTIME)
    return info.value


def test_every_invalid_fixture_is_refused_naming_the_field(hub_fixtures: Path) -> None:
    files = sorted((hub_fixtures / "invalid").iterdir())
    assert {f.name for f in files} == set(EXPECTED_FIELD), "a new invalid fixture needs an expectation"
    for path in files:
        error = _refusal(path.read_bytes())
        assert error.field == EXPECTED_FIELD[path.name], path.name
        assert str(error).startswith(f"{error.field}: "), path.name
        if error.field == "manifest":
            assert "not a JSON object" in error.problem, path.name


def test_every_valid_fixture_is_accepted(hub_fixtures: Path) -> None:
    for path in sorted((hub_fixtures / "valid").iterdir()):
        manifest = parse_manifest(path.read_bytes(), runtime=RUNTIME)
        assert manifest.to_json() == json.loads(path.read_bytes()), path.name


def test_digest_is_stable_across_formatting_and_key_order(order_status: bytes) -> None:
    a = parse_manifest(order_status, runtime=RUNTIME)
    reordered = dict(reversed(list(json.loads(order_status).items())))
    b = parse_manifest(json.dumps(reordered, separators=(",", ":")).encode(), runtime=RUNTIME)
    assert a.digest == b.digest and a.digest.startswith("sha256:") and len(a.digest) == 71


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extra": 1}, "manifest.extra"),
        ({"constructor": {}}, "manifest.constructor"),
        ({"author": {"name": "A", "admin": True}}, "manifest.author.admin"),
        ({"author": {"name": "A", "email": "not-an-email"}}, "manifest.author.email"),
        ({"author": 7}, "manifest.author"),
        ({"entry": "../../evil.js"}, "manifest.entry"),
        ({"entry": "/abs/path.js"}, "manifest.entry"),
        ({"name": ""}, "manifest.name"),
        ({"name": "x" * 101}, "manifest.name"),
        ({"id": "noseparator"}, "manifest.id"),
        ({"id": "Acme.Upper"}, "manifest.id"),
        ({"version": "1.2"}, "manifest.version"),
        ({"version": "01.2.3"}, "manifest.version"),
        ({"permissions": ["messages:read", 3]}, "manifest.permissions[1]"),
        ({"runtime": ""}, "manifest.runtime"),
        ({"runtime": 1}, "manifest.runtime"),
        ({"runtime": "v1.2.3"}, "manifest.runtime"),
        ({"runtime": ">= 1.2.3"}, "manifest.runtime"),
        ({"runtime": "1.2.3+build"}, "manifest.runtime"),
        ({"runtime": "||"}, "manifest.runtime"),
        ({"runtime": " ".join([">=1.0.0"] * 17)}, "manifest.runtime"),
    ],
)
def test_bad_fields_are_refused_with_their_path(change: dict, field: str) -> None:
    assert _refusal({**BASE, **change}).field == field


def test_missing_required_field_is_named() -> None:
    for key in ("id", "name", "version", "runtime", "permissions"):
        body = {k: v for k, v in BASE.items() if k != key}
        assert _refusal(body).field == f"manifest.{key}"


def test_duplicate_json_keys_are_refused() -> None:
    raw = b'{"id": "x.y", "id": "a.b", "name": "Y", "version": "0.1.0", "runtime": "^1.0.0", "permissions": []}'
    assert _refusal(raw).field == "manifest.id"


def test_body_size_is_bounded_before_parsing() -> None:
    raw = b" " * (MAX_MANIFEST_BYTES + 1)
    error = _refusal(raw)
    assert error.field == "manifest" and "larger than" in error.problem


@pytest.mark.parametrize("raw", [b"null", b"42", b'"text"', b"\xff\xfe{}", b"[" * 100000 + b"]" * 100000])
def test_non_objects_say_so(raw: bytes) -> None:
    error = _refusal(raw)
    assert error.field == "manifest"


def test_nan_is_not_json() -> None:
    assert _refusal(b'{"id": NaN}').field == "manifest"


@pytest.mark.parametrize(
    "rng",
    [">=1.2.0 <2.0.0", "^1.4.0", "~1.6", "1.x", "*", "1.0.0 - 1.9.9", "^1.0.0 || ^2.0.0", "=1.6.2"],
)
def test_ranges_of_the_restricted_grammar_are_accepted(rng: str) -> None:
    assert validate_runtime_range(rng, "runtime") == rng


def test_runtime_satisfaction_follows_npm_semantics() -> None:
    assert runtime_satisfies(">=1.2.0 <2.0.0", "1.6.2")
    assert not runtime_satisfies("^2.0.0", "1.6.2")
    assert not runtime_satisfies("~1.5.0", "1.6.2")
    assert not runtime_satisfies("^1.0.0", "2.0.0-rc.1"), "pre-releases never satisfy a plain range"


def test_shipped_runtime_is_the_fixture_copy(hub_fixtures: Path) -> None:
    assert DEFAULT_RUNTIME == json.loads((hub_fixtures / "runtime.json").read_text())
    runtime = current_runtime()
    assert runtime.version == "1.6.2" and "contacts:write" in runtime.known_permissions


def test_runtime_is_overridable_by_settings(settings, tmp_path: Path) -> None:
    """``BOTMESH_HUB_RUNTIME_*`` reach the hub through the settings (``config.load_tuning`` reads the env)."""
    settings.BOTMESH_HUB_RUNTIME_VERSION = "2.1.0"
    assert current_runtime().version == "2.1.0"
    data = {"runtime_version": "3.0.0", "known_permissions": ["messages:read"]}
    (tmp_path / "rt.json").write_text(json.dumps(data))
    settings.BOTMESH_HUB_RUNTIME_VERSION = None
    settings.BOTMESH_HUB_RUNTIME_FILE = str(tmp_path / "rt.json")
    assert current_runtime().known_permissions == ("messages:read",)
    settings.BOTMESH_HUB_RUNTIME_VERSION = "bogus"
    with pytest.raises(ValidationError):
        current_runtime()
