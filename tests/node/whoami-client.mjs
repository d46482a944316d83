// whoami-client.mjs: drives a whoami MCP server with TypeScript SDK clients
// (Client + StreamableHTTPClientTransport), for tests/interop_ts_test.go.
//
// Usage: node whoami-client.mjs --url URL [--sessions 50] [--calls 5] [--sealed] [--legacy-sse]
//                               [--hold-dir DIR]
//
// Runs --sessions concurrent sessions. Each connects (initialize, then the
// SDK's standalone GET stream), calls the whoami tool --calls times, ends
// the session with DELETE and closes. A session is ok when every call was
// answered by the server that answered its first call, reporting the
// client's own session ID, and its DELETE succeeded. With --sealed (a proxy
// with seal_session_ids), the server must instead report the same ID of its
// own on every call, which the client's ID does not show. Prints one JSON line:
// {"sessions","ok","calls","deleted","perServer":{name:sessions},"errors":[first 5]}
//
// With --legacy-sse the sessions use the legacy HTTP+SSE transport
// (SSEClientTransport; --url is the SSE endpoint): the session is the one
// the endpoint event names, every call must be answered by the server that
// answered initialize on the stream, seeing the same session on every call,
// and the session ends by closing the stream (no DELETE).
// and exits 0 (the caller judges the numbers).
//
// With --hold-dir, every session makes its first call, then the client
// writes DIR/ready and waits until DIR/go exists before the remaining
// calls: the caller kills or restarts servers in between. The calls after
// the hold may be answered by another server (a failover), which then must
// answer every one of them, reporting one session ID of its own;
// perServer counts the servers that answered the first calls, and
// "movedTo" the servers that answered after the hold, when another.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string' },
    sessions: { type: 'string', default: '50' },
    calls: { type: 'string', default: '5' },
    sealed: { type: 'boolean', default: false },
    'legacy-sse': { type: 'boolean', default: false },
    'hold-dir': { type: 'string' },
  },
});
if (!opt.url) {
  console.error('--url is required');
  process.exit(2);
}
const sessions = Number(opt.sessions);
const calls = Number(opt.calls);

// runLegacySession is runSession over the legacy HTTP+SSE transport.
async function runLegacySession() {
  const rep = { server: '', seen: '', calls: 0, deleted: false, error: '' };
  const client = new Client({ name: 'affinity-test-ts-legacy', version: '0.0.0' });
  const transport = new SSEClientTransport(new URL(opt.url));
  try {
    await client.connect(transport);
    rep.server = client.getServerVersion()?.name ?? '';
    for (let i = 1; i <= calls; i++) {
      const res = await client.callTool({ name: 'whoami', arguments: {} });
      const out = res.structuredContent;
      if (res.isError || !out) throw new Error(`call ${i}: ${JSON.stringify(res)}`);
      if (i === 1) rep.seen = out.session;
      if (out.server !== rep.server || out.session !== rep.seen) {
        throw new Error(`call ${i} misrouted: answered by ${out.server} for session ${out.session}, stream on ${rep.server} with ${rep.seen}`);
      }
      rep.calls++;
    }
  } catch (err) {
    rep.error = String(err?.message ?? err);
  } finally {
    await client.close().catch(() => {});
  }
  return rep;
}

async function runSession() {
  if (opt['legacy-sse']) return runLegacySession();
  const rep = { server: '', seen: '', calls: 0, deleted: false, error: '' };
  const client = new Client({ name: 'affinity-test-ts', version: '0.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(opt.url), {
    reconnectionOptions: { maxRetries: 0, initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1 },
  });
  try {
    await client.connect(transport);
    const sid = transport.sessionId;
    if (!sid) throw new Error('no session ID after initialize');
    for (let i = 1; i <= calls; i++) {
      if (i === 2 && opt['hold-dir']) {
        await hold();
        [rep.before, rep.server, rep.seen] = [rep.server, '', ''];
      }
      const res = await client.callTool({ name: 'whoami', arguments: {} });
      const out = res.structuredContent;
      if (res.isError || !out) throw new Error(`call ${i}: ${JSON.stringify(res)}`);
      if (!rep.server) [rep.server, rep.seen] = [out.server, out.session];
      const moved = rep.before && rep.server !== rep.before;
      const sameSession = opt.sealed || moved ? out.session === rep.seen && !sid.includes(out.session) : out.session === sid;
      if (out.server !== rep.server || !out.session || !sameSession) {
        throw new Error(`call ${i} misrouted: answered by ${out.server} for session ${out.session}, session began on ${rep.server} as ${sid}`);
      }
      rep.calls++;
    }
    if (rep.before !== undefined) [rep.after, rep.server] = [rep.server, rep.before];
    await transport.terminateSession();
    rep.deleted = transport.sessionId === undefined;
    if (!rep.deleted) throw new Error('DELETE did not end the session');
  } catch (err) {
    rep.error = String(err?.message ?? err);
  } finally {
    await client.close().catch(() => {});
  }
  return rep;
}

// hold waits, with every other session, until the caller creates
// DIR/go, after the last of them arrived and DIR/ready was written.
let arrived = 0;
let released;
const go = new Promise((resolve) => (released = resolve));
function arrive() {
  if (++arrived !== sessions) return;
  fs.writeFileSync(path.join(opt['hold-dir'], 'ready'), '');
  const poll = setInterval(() => {
    if (fs.existsSync(path.join(opt['hold-dir'], 'go'))) {
      clearInterval(poll);
      released();
    }
  }, 20);
}
async function hold() {
  arrive();
  await go;
}

const reports = await Promise.all(
  Array.from({ length: sessions }, async () => {
    const rep = await runSession();
    // A session that failed before its hold still lets the others go on.
    if (opt['hold-dir'] && rep.before === undefined) arrive();
    return rep;
  }),
);
const summary = { sessions, ok: 0, calls: 0, deleted: 0, perServer: {}, errors: [] };
for (const r of reports) {
  summary.calls += r.calls;
  if (r.deleted) summary.deleted++;
  if (r.error) {
    if (summary.errors.length < 5) summary.errors.push(r.error);
    continue;
  }
  summary.ok++;
  summary.perServer[r.server] = (summary.perServer[r.server] ?? 0) + 1;
  if (r.after && r.after !== r.server) {
    summary.movedTo ??= {};
    summary.movedTo[r.after] = (summary.movedTo[r.after] ?? 0) + 1;
  }
}
console.log(JSON.stringify(summary));
process.exit(0);
