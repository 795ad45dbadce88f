"""``./dev screenshots`` shows one page of each kind (scripts/screenshots.py), named after the page."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "screenshots.py"
spec = importlib.util.spec_from_file_location("screenshots", SCRIPT)
assert spec is not None and spec.loader is not None
screenshots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(screenshots)


def test_pages_differing_only_in_ids_are_one_kind() -> None:
    kind = screenshots.kind_of
    assert kind("/t/tienda/crm/contacts/c_01a2/") == kind("/t/tienda/crm/contacts/c_99") == "/t/tienda/crm/contacts/_/"
    assert kind("/t/tienda/plugins/acme.order-status/") == kind("/t/tienda/plugins/x.y/")
    assert kind("/t/tienda/deployments/tienda-bot/") != kind("/t/tienda/deployments/")
    assert kind("/t/tienda/crm/segments/") != kind("/t/tienda/crm/contacts/")


def test_file_names_say_the_page() -> None:
    assert screenshots.slug("/t/tienda/") == "overview"
    assert screenshots.slug("/t/tienda/inbox/cv_3d84a8625cb0b0361ff4/") == "inbox-id"
    assert screenshots.slug("/t/tienda/deployments/tienda-bot/confirm/rollback/1.1.1/") == (
        "deployments-tienda-bot-confirm-rollback-id"
    )
