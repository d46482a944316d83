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
