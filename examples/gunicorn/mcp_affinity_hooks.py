"""gunicorn server hooks that give every worker a unix socket of its own, so
that a session-affine proxy such as Caddy's `mcp_proxy` can send each MCP
session to the worker that holds it -- with the `workers = N` of your
gunicorn.conf.py unchanged.

Use: put this file next to your gunicorn.conf.py and add one line to it:

    from mcp_affinity_hooks import *  # noqa: F401,F403

Then point the proxy at the sockets:

    mcp_proxy {
        dynamic unix_sockets /run/mcp/worker-*.sock
    }

What it does:

- Slots. Each worker serves `$MCP_SOCKET_DIR/worker-<slot>.sock` (default
  directory /run/mcp), slot 0..N-1, besides gunicorn's shared `bind`
  listener. A new worker takes a free slot, so a worker that crashes (even
  SIGKILL), times out or is recycled by `max_requests` is replaced on its
  own slot. On a HUP reload each new worker takes over the slot of an old
  one, the oldest first, so the sockets stay worker-0 ... worker-<N-1>.
- The master opens each slot's socket (binding a temporary name and
  renaming it into place, so a leftover file is replaced atomically) and
  keeps it open across the slot's workers: while a worker is replaced,
  connections wait in the socket's backlog for the next one instead of
  being refused. A worker being replaced stops accepting and finishes the
  requests it has (gunicorn's graceful shutdown).
- The shared `bind` listener keeps answering (health checks, direct use):
  every worker serves it too. Requests through it reach any worker, so MCP
  sessions work only through the per-worker sockets.
- Stale sockets: the master closes and removes a slot's socket when no
  worker serves it and gunicorn will not start one for it (fewer workers
  after a HUP or TTOU), and at exit; at start it removes `worker-*.sock`
  files that refuse connections (left by a master that was killed).

MCP sessions live in a worker's memory: they end with the worker (crash,
`max_requests`, HUP), and their next request gets 404 from the worker that
replaced it, after which clients start new sessions.

The directory must exist or be creatable by the gunicorn master, and the
proxy must be allowed to connect to the sockets: they are created with
gunicorn's `umask` (default 0, so anyone on the machine can connect; set
`umask = 0o007` and a shared group to restrict them) and chowned to its
`user`/`group`. One directory per gunicorn: two masters sharing one would
take each other's slots.

The hooks are on_starting, pre_fork, post_fork, child_exit, worker_exit and
on_exit. If your gunicorn.conf.py defines one of them itself, call ours
from yours (e.g. `mcp_affinity_hooks.post_fork(server, worker)`).
"""

import errno
import fnmatch
import os
import socket

from gunicorn import sock as gunicorn_sock
from gunicorn import util

__all__ = ["on_starting", "pre_fork", "post_fork", "child_exit", "worker_exit", "on_exit"]

SOCKET_DIR_ENV = "MCP_SOCKET_DIR"
DEFAULT_SOCKET_DIR = "/run/mcp"
SOCKET_NAME = "worker-%d.sock"
SOCKET_GLOB = "worker-*.sock"


def socket_dir():
    """The directory of the workers' sockets: $MCP_SOCKET_DIR, default /run/mcp.
    Read at every call, so that gunicorn's `raw_env` can set it."""
    return os.environ.get(SOCKET_DIR_ENV) or DEFAULT_SOCKET_DIR


def socket_path(slot):
    return os.path.join(socket_dir(), SOCKET_NAME % slot)


# The master's listening socket of each slot, by slot. A slot's socket
# outlives its workers: connections wait in its backlog while a crashed or
# recycled worker is replaced, instead of being refused.
slot_sockets = {}


def on_starting(server):
    """Master, at start: creates the socket directory and removes stale sockets."""
    os.makedirs(socket_dir(), exist_ok=True)
    if not os.access(socket_dir(), os.W_OK | os.X_OK):
        raise RuntimeError("mcp_affinity_hooks: cannot create sockets in %s; make it writable by gunicorn's user "
                           "or set %s" % (socket_dir(), SOCKET_DIR_ENV))
    remove_stale_sockets(server)


def pre_fork(server, worker):
    """Master, before forking a worker: gives it a slot, and the slot a
    listening socket if it has none yet."""
    slot = choose_slot(server)
    if slot not in slot_sockets:
        path = socket_path(slot)
        slot_sockets[slot] = gunicorn_sock.UnixSocket(path, server.cfg, server.log, fd=listen_replacing(path, server.cfg))
    worker.mcp_slot = slot


def post_fork(server, worker):
    """Worker, before it loads the app: serves its slot's socket besides the
    shared listeners, and closes its copies of the other slots' sockets, so
    that a slot the master retires is closed for good."""
    for slot, s in list(slot_sockets.items()):
        if slot != worker.mcp_slot:
            s.close()
    worker.sockets = list(worker.sockets) + [slot_sockets[worker.mcp_slot]]
    server.log.info("Worker %s serves slot %d at %s", os.getpid(), worker.mcp_slot, slot_sockets[worker.mcp_slot])


def child_exit(server, worker):
    """Master, after a worker exited: retires its slot unless a worker
    serves it or gunicorn will start one for it."""
    release_slot(server, worker)


def worker_exit(server, worker):
    """Runs in the worker as it exits, and in the master for a worker that
    vanished before it could be signalled; only the latter needs cleaning."""
    if os.getpid() == server.pid:
        release_slot(server, worker)


def on_exit(server):
    """Master, at exit: closes and removes every slot's socket."""
    for slot in list(slot_sockets):
        retire_slot(slot)
    remove_stale_sockets(server)


def choose_slot(server):
    """A free slot whose socket is kept (connections wait in it) first;
    otherwise, among 0..N-1, the slot whose youngest worker is the oldest,
    a free slot counting as the oldest and the lowest free slot first.
    Replacing a crashed or recycled worker takes its slot; during a HUP
    reload, when the old workers still run, each new worker takes over the
    slot of the oldest old worker not yet replaced."""
    youngest = {}
    for w in server.WORKERS.values():
        slot = getattr(w, "mcp_slot", None)
        if slot is not None:
            youngest[slot] = max(youngest.get(slot, 0), w.age)
    waiting = sorted(s for s in slot_sockets if s not in youngest)
    if waiting:
        return waiting[0]
    return min(range(max(server.num_workers, 1)), key=lambda s: (youngest.get(s, -1), s))


def listen_replacing(path, cfg):
    """Binds and listens on a temporary path next to path, then renames it
    over path (atomic, so a socket left there is replaced without a moment
    where path refuses connections), and returns the socket's descriptor."""
    tmp = os.path.join(os.path.dirname(path), ".%s.%d" % (os.path.basename(path), os.getpid()))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        remove(tmp)
        old_umask = os.umask(cfg.umask)
        try:
            s.bind(tmp)
        finally:
            os.umask(old_umask)
        util.chown(tmp, cfg.uid, cfg.gid)
        s.listen(cfg.backlog)
        os.rename(tmp, path)
    except BaseException:
        s.close()
        remove(tmp)
        raise
    return s.detach()


def release_slot(server, worker):
    """Retires the slot of a worker that exited, unless another worker
    serves it or gunicorn is about to replace the worker (fewer workers run
    than it wants)."""
    slot = getattr(worker, "mcp_slot", None)
    if slot is None or any(getattr(w, "mcp_slot", None) == slot for w in server.WORKERS.values()):
        return
    if len(server.WORKERS) < server.num_workers:
        return
    retire_slot(slot)


def retire_slot(slot):
    """Closes the slot's socket in the master and removes its file, so that
    connecting to it is refused and the proxy stops offering it."""
    s = slot_sockets.pop(slot, None)
    if s is not None:
        s.close()
    remove(socket_path(slot))


def remove_stale_sockets(server):
    """Removes the worker-*.sock files in the socket directory that refuse
    connections."""
    try:
        names = os.listdir(socket_dir())
    except FileNotFoundError:
        return
    for name in fnmatch.filter(names, SOCKET_GLOB):
        path = os.path.join(socket_dir(), name)
        if refused(path):
            remove(path)
            server.log.info("Removed stale socket %s", path)


def refused(path):
    """Whether connecting to the unix socket at path is refused: nothing
    listens on it. A socket whose backlog is full (a timeout) is in use."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    try:
        s.connect(path)
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()


def remove(path):
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
