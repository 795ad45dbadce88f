import json
import pytest
from django.test import Client
from botmesh_admin.tenancy import services as tenancy
from tests.backends import unique_id

DEEP = b"[" * 900 + b"]" * 900
DEEPOBJ = b"{\"a\":" * 900 + b"1" + b"}" * 900

@pytest.mark.django_db
def test_probe():
    t = unique_id("shop")
    tenancy.tenant_create(t, name="S")
    tok = tenancy.token_create(t, name="ci")[1]
    bot = tenancy.token_create(t, name="b", role="bot")[1]
    c = Client(raise_request_exception=False)
    for path, body, token in [
        ("ledger", DEEP, bot), ("contacts", DEEPOBJ, tok), ("segments", DEEPOBJ, tok), ("plugins", DEEPOBJ, tok),
        ("bots/b1/metrics", DEEPOBJ, bot), ("bots/b1/versions", DEEPOBJ, tok), ("conversations/cv_00000000000000000000/notes", DEEPOBJ, tok),
        ("contacts", b'{"a": NaN}', tok),
    ]:
        r = c.post(f"/api/v1/tenants/{t}/{path}", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
        print(path, r.status_code, r.content[:200])

@pytest.mark.django_db
def test_probe2():
    t = unique_id("shop")
    tenancy.tenant_create(t, name="S")
    tok = tenancy.token_create(t, name="ci")[1]
    bot = tenancy.token_create(t, name="b", role="bot")[1]
    c = Client(raise_request_exception=False)
    for n in (60, 200, 900, 3000):
        body = b'{"replica":"r1","x":' + b"[" * n + b"]" * n + b"}"
        r = c.post(f"/api/v1/tenants/{t}/bots/b1/metrics", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {bot}")
        print("metrics", n, r.status_code, r.content[:200])
    r = c.post(f"/api/v1/tenants/{t}/contacts", b'{"a": NaN}', content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {tok}")
    print("nan", r.status_code, r.content[:200])
