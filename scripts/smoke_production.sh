#!/usr/bin/env bash
# Start the production stack as the README's production section documents it
# (gunicorn web, Celery worker, Celery beat; PostgreSQL and Redis) and smoke-test
# it over HTTP: /readyz, a login, one API call with a token. Needs the URLs that
# scripts/services.sh exports.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/smoke_production.py
