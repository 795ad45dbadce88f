"""``/healthz`` and ``/readyz`` answer GET and HEAD only; any other method is 405 with ``Allow: GET, HEAD``.

Regression (session 7 review): a POST (or PUT, DELETE) to a probe was answered as a GET, 200. Over real HTTP
(``live_server``): the probes are served before any middleware, so the view's own rule is what refuses.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest


def _call(url: str, method: str) -> tuple[int, str | None, bytes]:
    request = urllib.request.Request(url, method=method, data=b"{}" if method in ("POST", "PUT") else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Allow"), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Allow"), error.read()


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_probe_answers_get_and_head_and_refuses_other_methods_with_405_and_allow(live_server, path: str) -> None:
    status, _, body = _call(live_server.url + path, "GET")
    assert status in (200, 503) and b'"status"' in body
    status, _, body = _call(live_server.url + path, "HEAD")
    assert status in (200, 503) and body == b""
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, allow, body = _call(live_server.url + path, method)
        assert (status, allow) == (405, "GET, HEAD"), method
        # JSON as the probe's own answers (a fresh user's report: a blank text/html body)
        assert json.loads(body)["error"] == "method_not_allowed", method
