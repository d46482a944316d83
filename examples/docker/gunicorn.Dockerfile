# The example Python MCP server of examples/gunicorn under ONE gunicorn with
# several workers, each also serving a unix socket of its own for mcp_proxy
# (mcp_affinity_hooks.py, imported by gunicorn.conf.py). Build from the root
# of a checkout:
#
#   docker build -f examples/docker/gunicorn.Dockerfile -t mcp-gunicorn:dev .
#
# The versions are the ones the repository's tests run (Debian 12's packages).
FROM python:3.11-slim-bookworm
RUN pip install --no-cache-dir gunicorn==20.1.0 uvicorn==0.17.6
WORKDIR /app
COPY examples/gunicorn/app.py examples/gunicorn/gunicorn.conf.py examples/gunicorn/mcp_affinity_hooks.py ./
ENV MCP_SOCKET_DIR=/run/mcp
CMD ["gunicorn", "app:app"]
