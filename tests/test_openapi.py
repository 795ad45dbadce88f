"""The OpenAPI document says what the API does (issue 18, item 3).

Unique schema names, every error status an operation can answer, declared
enums, the contact import's request bodies, and one compare-and-set name.
"""

from __future__ import annotations

import re
import typing
from typing import Any

import pydantic
import pytest

from botmesh_admin.api import api, declared_role, error_statuses

PREFIX = "/api/v1"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return api.get_openapi_schema(path_prefix=PREFIX)


def _operations() -> list[tuple[str, Any]]:
    """Return (OpenAPI path, operation) of every operation the API serves."""
    found = []
    for bound in api._get_bound_routers():
        for path, path_view in bound.path_operations.items():
            openapi_path = re.sub(r"\{\w+:(\w+)\}", r"{\1}", bound.prefix + path)  # {anytext:bot} -> {bot}
            found.extend((PREFIX + "/" + openapi_path.strip("/"), op) for op in path_view.operations)
    return found


def _models(annotation: Any, seen: set[type]) -> None:
    """Add every pydantic model ``annotation`` names (through lists, unions, generics) to ``seen``."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        if annotation in seen:
            return
        seen.add(annotation)
        for field in annotation.model_fields.values():
            _models(field.annotation, seen)
        return
    for arg in typing.get_args(annotation):
        _models(arg, seen)


def test_schema_names_are_unique(doc: dict[str, Any]) -> None:
    """``AuditOut``, ``RevisionIn`` and ``AuditParams`` were each defined by hub and deployments."""
    seen: set[type] = set()
    for _path, operation in _operations():
        for model in operation.response_models.values():
            _models(model, seen)
        for param in operation.signature.params:
            _models(param.annotation, seen)
    by_name: dict[str, set[str]] = {}
    for model in seen:
        if model.__module__.startswith(("ninja.", "pydantic.")) or "[" in model.__name__:
            continue  # ninja's own wrappers; generic pages are named after their item
        by_name.setdefault(model.__name__, set()).add(f"{model.__module__}.{model.__qualname__}")
    duplicates = {name: where for name, where in by_name.items() if len(where) > 1}
    assert not duplicates
    assert {"PluginAuditOut", "DeploymentAuditOut", "PluginRevisionIn", "ActiveRevisionIn"} <= set(
        doc["components"]["schemas"]
    )


def test_every_operation_documents_the_errors_it_can_answer(doc: dict[str, Any]) -> None:
    operations = {(m.upper(), path): op for path, ops in doc["paths"].items() for m, op in ops.items()}
    assert len(operations) >= 60
    for path, operation in _operations():
        for method in operation.methods:
            documented = {int(s) for s in operations[(method, path)]["responses"]}
            role = operations[(method, path)]["x-botmesh-role"]
            assert role == declared_role(operation.view_func), (method, path)
            assert error_statuses([method], role) <= documented, (method, path, documented)
            assert {401, 404, 422} <= documented
            if role != "member":
                assert 403 in documented


def test_compare_and_set_operations_document_409_and_say_expected_version(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    cas = [name for name, schema in schemas.items() if "expected_version" in schema.get("properties", {})]
    assert {"AssignIn", "ContactPatch", "PermissionsIn", "PluginRevisionIn", "ActiveRevisionIn", "RollbackIn"} <= set(
        cas
    )
    assert not [name for name, schema in schemas.items() if "expected_revision" in schema.get("properties", {})]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            refs = [body.get("$ref", "")] + [s.get("$ref", "") for s in body.get("anyOf", [])]
            if any(ref.rsplit("/", 1)[-1] in cas for ref in refs if ref):
                assert 409 in {int(s) for s in op["responses"]}, (method, path)


@pytest.mark.parametrize(
    ("schema", "field", "values"),
    [
        ("ChannelIn", "kind", {"whatsapp", "telegram"}),
        ("StatusIn", "status", {"open", "pending", "resolved"}),
        ("TokenIn", "role", {"admin", "agent", "bot"}),
        ("GateResultIn", "result", {"succeeded", "failed", "inconclusive", "error"}),
        ("ConsentIn", "status", {"granted", "denied", "unknown"}),
        ("ConsentIn", "channel", {"whatsapp", "telegram", "email"}),
        ("CampaignIn", "channel", {"whatsapp", "telegram"}),
    ],
)
def test_enums_are_declared(doc: dict[str, Any], schema: str, field: str, values: set[str]) -> None:
    assert set(doc["components"]["schemas"][schema]["properties"][field]["enum"]) == values


def test_enum_query_parameters_are_declared(doc: dict[str, Any]) -> None:
    params = {
        p["name"]: p["schema"] for p in doc["paths"][f"{PREFIX}/tenants/{{tenant}}/conversations"]["get"]["parameters"]
    }
    assert params["view"]["enum"] == ["all", "mine", "unassigned"]
    assert params["status"]["enum"] == ["open", "pending", "resolved"]


def test_contact_import_documents_its_multipart_and_csv_bodies(doc: dict[str, Any]) -> None:
    body = doc["paths"][f"{PREFIX}/tenants/{{tenant}}/contacts/imports"]["post"]["requestBody"]
    multipart = body["content"]["multipart/form-data"]["schema"]
    assert multipart["required"] == ["file"] and multipart["properties"]["file"]["format"] == "binary"
    assert body["content"]["text/csv"]["schema"] == {"type": "string"}
