# botmesh-admin image: one image for web (gunicorn), Celery worker and Celery beat.
# No secrets or data in any layer: configuration comes from the environment
# (or *_FILE secrets) at run time. Built and run outside CI (no Docker engine there).
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    BOTMESH_DATA_DIR=/var/lib/botmesh \
    BOTMESH_STATIC_ROOT=/app/static

RUN groupadd --system botmesh && useradd --system --gid botmesh --home-dir /app --shell /usr/sbin/nologin botmesh

# pg_dump/pg_restore for `manage.py backup` / `restore` (Debian 12: client 15, as the server in compose).
RUN apt-get update && \
    apt-get install -y --no-install-recommends postgresql-client && \
    rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY botmesh_admin ./botmesh_admin
COPY inbox ./inbox
COPY crm ./crm
COPY campaigns ./campaigns
COPY hub ./hub
COPY deployments ./deployments
COPY manage.py ./
RUN pip install . && \
    mkdir -p /var/lib/botmesh && \
    python manage.py collectstatic --noinput -v 0 && \
    rm -rf /var/lib/botmesh/* && \
    chown -R botmesh:botmesh /var/lib/botmesh

USER botmesh
VOLUME ["/var/lib/botmesh"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"
CMD ["gunicorn", "botmesh_admin.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--threads", "4", "--graceful-timeout", "30", "--access-logfile", "-"]
