# goodput collector (and dashboard) image: docker build -t goodput .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Dependencies first (cached while only the code changes), then the code.
COPY pyproject.toml README.md ./
COPY ingest_client ./ingest_client
COPY services ./services
COPY dashboards ./dashboards
COPY migrations ./migrations
COPY alembic.ini ./
# Editable: `goodput db upgrade` finds migrations/ next to services/ (they are not packaged in the wheel).
# waitress: the dashboard's production WSGI server (python -m dashboards uses it when installed).
RUN pip install -e ".[server]" waitress

RUN useradd --create-home --uid 10001 goodput
USER goodput
WORKDIR /home/goodput

ENV GOODPUT_HOST=0.0.0.0 \
    GOODPUT_PORT=8000
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GOODPUT_PORT', '8000') + '/healthz', timeout=4)"]

ENTRYPOINT ["goodput"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--no-dashboard"]
