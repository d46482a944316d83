// whoami-server.mjs: a stateful MCP server on the TypeScript SDK
// (StreamableHTTPServerTransport, sessionIdGenerator randomUUID, one
// transport per session in a per-process map, as the SDK's example apps do),
// used by tests/interop_ts_test.go as an upstream of the proxy.
//
// Its whoami tool answers {server, session}: this process's --name and the
// session ID the request arrived on, like the Go whoami server, so the Go
// test helpers work against it.
//
// Usage: node whoami-server.mjs --name NAME [--listen 127.0.0.1:0] [--json]
//                               [--unknown-session 404|400] [--event-store]
//                               [--express [--allowed-hosts h1,h2] [--oauth]] [--legacy-sse]
// Writes "127.0.0.1:PORT" to $MCP_ADDR_FILE once listening.
//
// Its slow tool ({milliseconds, steps}) sends steps progress notifications
// spread over milliseconds on the call's stream, then answers "done", as
// the Go whoami server's does. With --event-store the transport keeps an
// event store (the SDK's InMemoryEventStore): its events carry IDs and a
// GET with Last-Event-ID replays them.
//
// With --express it is the Express app the SDK's createMcpExpressApp makes
// (Express 5, JSON body parser, and for a server bound to 127.0.0.1 the
// SDK's DNS-rebinding Host check: 403 unless Host is localhost, 127.0.0.1
// or [::1]; --allowed-hosts replaces that list), with routes for POST and
// DELETE /mcp only, as apps without a standalone SSE stream are written:
// GET /mcp gets Express's own 404 "Cannot GET /mcp". It trusts X-Forwarded-*
// from loopback (`trust proxy`), and its 401 names resource_metadata from
// the request's protocol and host, as apps that build OAuth metadata from
// the request do.
//
// With --oauth (and --express) it is also its own OAuth authorization
// server as far as discovery goes: GET
// /.well-known/oauth-protected-resource/mcp serves RFC 9728 metadata whose
// resource is <origin>/mcp and whose authorization server is <origin>, and
// GET /.well-known/oauth-authorization-server serves RFC 8414 metadata with
// issuer <origin>, the origin built from the request as above. Only the
// path-aware resource URL is served, as servers with one MCP endpoint do;
// the root /.well-known/oauth-protected-resource gets 404.
//
// With --legacy-sse it speaks the legacy HTTP+SSE transport (protocol
// 2024-11-05) with the SDK's SSEServerTransport, as the SDK's documentation
// shows: GET /sse opens a session's stream, whose endpoint event names
// /messages?sessionId=<uuid>; POST /messages?sessionId=<uuid> delivers a
// message (202), or gets 404 "Session not found" for a session this process
// does not hold; the session ends when its stream closes.
//
// Around the MCP transport it behaves like a typical Node app:
//   - every response carries X-Custom: NAME, two Set-Cookie headers, and
//     Mcp-Protocol-Version echoing the request's;
//   - CORS: OPTIONS preflights get 204 allowing the asked method and headers;
//   - a request with X-Test-Auth: deny gets 401 with WWW-Authenticate;
//   - an unknown session gets 404 -32001 (the SDK transport's answer) or,
//     with --unknown-session 400, the 400 of the SDK's example apps and
//     server-everything; a request of a known session with
//     X-Test-Pretend-Unknown: 1 gets that same answer, without the session
//     being forgotten;
//   - GET /debug/stats returns counters of what reached this process.
import fs from 'node:fs';
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { SSEServerTransport } from '@modelcontextprotocol/sdk/server/sse.js';
import { createMcpExpressApp } from '@modelcontextprotocol/sdk/server/express.js';
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js';
import { z } from 'zod';

const { values: opt } = parseArgs({
  options: {
    name: { type: 'string', default: 'ts' },
    listen: { type: 'string', default: '127.0.0.1:0' },
    json: { type: 'boolean', default: false },
    'unknown-session': { type: 'string', default: '404' },
    express: { type: 'boolean', default: false },
    'allowed-hosts': { type: 'string' },
    'legacy-sse': { type: 'boolean', default: false },
    oauth: { type: 'boolean', default: false },
    'event-store': { type: 'boolean', default: false },
  },
});
if (!['400', '404'].includes(opt['unknown-session'])) {
  console.error('--unknown-session must be 400 or 404');
  process.exit(2);
}

// transports maps session ID to the transport of that session.
const transports = new Map();

// stats counts what reached this process, for tests to check.
const stats = { requests: 0, options: 0, initialized: 0, deleted: 0, unknown: 0, bySession: {} };

function newMcpServer() {
  const server = new McpServer({ name: opt.name, version: '1.0.0' });
  server.registerTool(
    'whoami',
    {
      description: "Reports this server's name and the session ID it sees.",
      inputSchema: {},
      outputSchema: { server: z.string(), session: z.string() },
    },
    async (_args, extra) => {
      const out = { server: opt.name, session: extra.sessionId ?? '' };
      return { content: [{ type: 'text', text: JSON.stringify(out) }], structuredContent: out };
    },
  );
  server.registerTool(
    'slow',
    {
      description: 'Sends progress notifications for a while, then answers done.',
      inputSchema: { milliseconds: z.number().int().min(0).max(600000).optional(), steps: z.number().int().min(0).max(10000).optional() },
    },
    async ({ milliseconds = 0, steps = 0 }, extra) => {
      const n = Math.max(steps, 1);
      const token = extra._meta?.progressToken;
      for (let i = 1; i <= n; i++) {
        await new Promise((resolve) => setTimeout(resolve, milliseconds / n));
        if (token !== undefined && steps > 0) {
          await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps } });
        }
      }
      return { content: [{ type: 'text', text: 'done' }] };
    },
  );
  return server;
}

function sendJSON(res, status, body, headers = {}) {
  res.writeHead(status, { 'Content-Type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

function unknownSession(res) {
  stats.unknown++;
  if (opt['unknown-session'] === '400') {
    sendJSON(res, 400, {
      jsonrpc: '2.0',
      error: { code: -32000, message: 'Bad Request: No valid session ID provided' },
      id: null,
    });
  } else {
    sendJSON(res, 404, { jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null });
  }
}

async function handle(req, res) {
  const url = new URL(req.url, 'http://localhost');
  if (url.pathname === '/debug/stats') {
    sendJSON(res, 200, { ...stats, sessions: transports.size });
    return;
  }
  stats.requests++;
  const sid = req.headers['mcp-session-id'];
  if (sid) stats.bySession[sid] = (stats.bySession[sid] ?? 0) + 1;

  // Headers every response of this app carries.
  res.setHeader('X-Custom', opt.name);
  res.setHeader('Set-Cookie', [`srv=${opt.name}; Path=/; HttpOnly`, 'theme=dark; Path=/']);
  if (req.headers['mcp-protocol-version']) res.setHeader('Mcp-Protocol-Version', req.headers['mcp-protocol-version']);
  const origin = req.headers.origin;
  if (origin) {
    res.setHeader('Access-Control-Allow-Origin', origin);
    res.setHeader('Access-Control-Expose-Headers', 'Mcp-Session-Id, Mcp-Protocol-Version, X-Custom');
    res.setHeader('Vary', 'Origin');
  }

  if (req.method === 'OPTIONS') {
    stats.options++;
    res.setHeader('Access-Control-Allow-Methods', 'GET, POST, DELETE');
    res.setHeader('Access-Control-Allow-Headers', req.headers['access-control-request-headers'] ?? '');
    res.setHeader('Access-Control-Max-Age', '600');
    res.writeHead(204);
    res.end();
    return;
  }
  if (opt['legacy-sse']) {
    await handleLegacy(req, res, url);
    return;
  }
  if (url.pathname !== '/mcp') {
    sendJSON(res, 404, { error: 'not found' });
    return;
  }
  if (req.headers['x-test-auth'] === 'deny') {
    sendJSON(
      res,
      401,
      { jsonrpc: '2.0', error: { code: -32001, message: 'Unauthorized' }, id: null },
      { 'WWW-Authenticate': `Bearer realm="mcp", resource_metadata="${publicOrigin(req)}/.well-known/oauth-protected-resource"` },
    );
    return;
  }

  if (sid) {
    const transport = transports.get(sid);
    if (!transport || req.headers['x-test-pretend-unknown'] === '1') {
      unknownSession(res);
      return;
    }
    if (req.method === 'DELETE') stats.deleted++;
    await transport.handleRequest(req, res, req.body);
    return;
  }
  if (req.method !== 'POST') {
    // GET and DELETE need a session, as in the SDK's example apps.
    sendJSON(res, 400, {
      jsonrpc: '2.0',
      error: { code: -32000, message: 'Bad Request: No valid session ID provided' },
      id: null,
    });
    return;
  }
  // A POST without a session: a new session if it is an initialize request
  // (the transport rejects anything else).
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    enableJsonResponse: opt.json,
    eventStore: opt['event-store'] ? new InMemoryEventStore() : undefined,
    onsessioninitialized: (id) => {
      stats.initialized++;
      transports.set(id, transport);
    },
  });
  transport.onclose = () => {
    if (transport.sessionId) transports.delete(transport.sessionId);
  };
  await newMcpServer().connect(transport);
  await transport.handleRequest(req, res, req.body);
}

// handleLegacy serves the legacy HTTP+SSE transport: GET /sse, POST /messages.
async function handleLegacy(req, res, url) {
  if (req.method === 'GET' && url.pathname === '/sse') {
    const transport = new SSEServerTransport('/messages', res);
    transports.set(transport.sessionId, transport);
    stats.initialized++;
    res.on('close', () => transports.delete(transport.sessionId));
    await newMcpServer().connect(transport);
    return;
  }
  if (req.method === 'POST' && url.pathname === '/messages') {
    const sid = url.searchParams.get('sessionId') ?? '';
    stats.bySession[sid] = (stats.bySession[sid] ?? 0) + 1;
    const transport = transports.get(sid);
    if (!transport) {
      stats.unknown++;
      res.writeHead(404).end('Session not found');
      return;
    }
    await transport.handlePostMessage(req, res);
    return;
  }
  sendJSON(res, 404, { error: 'not found' });
}

// publicOrigin is the scheme and host this app names in absolute URLs: Express's
// req.protocol and req.host (from X-Forwarded-Proto and X-Forwarded-Host
// when sent by a trusted proxy); a fixed loopback origin without Express.
function publicOrigin(req) {
  return req.app ? `${req.protocol}://${req.host}` : 'http://127.0.0.1';
}

// listener returns the app: plain Node http, or with --express an Express
// app with routes for POST and DELETE /mcp only.
function listener(host) {
  const serve = (req, res) =>
    handle(req, res).catch((err) => {
      console.error('error handling request:', err);
      if (!res.headersSent) sendJSON(res, 500, { jsonrpc: '2.0', error: { code: -32603, message: 'Internal server error' }, id: null });
      else res.end();
    });
  if (!opt.express) return serve;
  const allowedHosts = opt['allowed-hosts']?.split(',');
  const app = createMcpExpressApp({ host, allowedHosts });
  app.set('trust proxy', 'loopback');
  app.get('/healthz', (req, res) => res.send('ok'));
  app.get('/debug/stats', serve);
  if (opt.oauth) {
    app.get('/.well-known/oauth-protected-resource/mcp', (req, res) =>
      res.json({ resource: `${publicOrigin(req)}/mcp`, authorization_servers: [publicOrigin(req)], bearer_methods_supported: ['header'] }),
    );
    app.get('/.well-known/oauth-authorization-server', (req, res) =>
      res.json({
        issuer: publicOrigin(req),
        authorization_endpoint: `${publicOrigin(req)}/authorize`,
        token_endpoint: `${publicOrigin(req)}/token`,
        response_types_supported: ['code'],
        code_challenge_methods_supported: ['S256'],
      }),
    );
  }
  app.post('/mcp', serve);
  app.delete('/mcp', serve);
  return app;
}

const [host, port] = [opt.listen.slice(0, opt.listen.lastIndexOf(':')), Number(opt.listen.slice(opt.listen.lastIndexOf(':') + 1))];
const httpServer = http.createServer(listener(host));
httpServer.listen(port, host, () => {
  const { address, port } = httpServer.address();
  const addr = `${address}:${port}`;
  if (process.env.MCP_ADDR_FILE) {
    fs.writeFileSync(`${process.env.MCP_ADDR_FILE}.tmp`, `${addr}\n`);
    fs.renameSync(`${process.env.MCP_ADDR_FILE}.tmp`, process.env.MCP_ADDR_FILE);
  }
  console.log(`whoami-ts ${opt.name} listening on http://${addr}/mcp`);
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
