"""Validation of what CI publishes: every bad field is named by its path."""

from __future__ import annotations

import pytest

from botmesh_admin.errors import ValidationError
from deployments.domain import parse_version_spec


def test_fixture_versions_parse_and_have_stable_digests(versions) -> None:
    specs = [parse_version_spec(v) for v in versions]
    assert [s.version for s in specs] == ["1.0.0", "1.1.0", "1.1.1", "1.2.0", "2.0.0-rc.1"]
    assert all(s.gates == ("unit-tests", "conversation-replay", "manual-approval") for s in specs)
    assert specs[0].to_json() == versions[0]
    assert parse_version_spec(dict(reversed(list(versions[0].items())))).digest == specs[0].digest
    assert len({s.digest for s in specs}) == 5


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": "v1"}, "version.version"),
        ({"version": 1}, "version.version"),
        ({"bot": "Tienda Bot"}, "version.bot"),
        (
            {"artifact": {"digest": "sha256:abc", "url": "oci://r.example.com/x:1"}},
            "version.artifact.digest",
        ),
        (
            {"artifact": {"digest": "sha256:" + "a" * 64, "url": "ftp://x/y"}},
            "version.artifact.url",
        ),
        (
            {"artifact": {"digest": "sha256:" + "a" * 64, "url": "oci://r.example.com/x", "x": 1}},
            "version.artifact.x",
        ),
        ({"artifact": "oci://x"}, "version.artifact"),
        ({"gates": "unit-tests"}, "version.gates"),
        ({"gates": ["unit-tests", "unit-tests"]}, "version.gates[1]"),
        ({"gates": ["ok", "Bad Gate"]}, "version.gates[1]"),
        ({"gates": [f"g{i}" for i in range(21)]}, "version.gates"),
        ({"notes": "x" * 2001}, "version.notes"),
        ({"createdBy": 5}, "version.createdBy"),
        ({"admin": True}, "version.admin"),
    ],
)
def test_bad_fields_are_refused_with_their_path(versions, change: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_version_spec({**versions[0], **change})
    assert info.value.field == field


def test_missing_fields_and_non_objects(versions) -> None:
    for key in ("bot", "version", "artifact", "gates"):
        with pytest.raises(ValidationError) as info:
            parse_version_spec({k: v for k, v in versions[0].items() if k != key})
        assert info.value.field == f"version.{key}"
    with pytest.raises(ValidationError) as info:
        parse_version_spec([versions[0]])
    assert info.value.field == "version" and "not a JSON object" in info.value.problem
