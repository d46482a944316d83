# gunicorn settings of the example: one gunicorn, several workers, each also
# serving a unix socket of its own for mcp_proxy (the import below; see
# mcp_affinity_hooks.py). Run gunicorn from this directory, where it reads
# this file by default:
#
#   MCP_SOCKET_DIR=/tmp/mcp gunicorn app:app
#
# and put `mcp_proxy { dynamic unix_sockets /tmp/mcp/worker-*.sock }` in front.
from mcp_affinity_hooks import *  # noqa: F401,F403

bind = "127.0.0.1:9000"
workers = 3
worker_class = "uvicorn.workers.UvicornWorker"
# Keep idle connections open longer than the proxy does (Caddy: 2 min), so
# that the proxy closes them: a request the proxy sends on a connection the
# worker is closing at that moment fails with 502 (gunicorn's default is 2 s).
keepalive = 300
