// resume-client.mjs: a TypeScript SDK client (Client +
// StreamableHTTPClientTransport) that calls a slow tool with a progress
// handler and reports what reached it, for tests/journal_test.go.
//
// Usage: node resume-client.mjs --url URL --cut-file PATH [--cut-after 3]
//                               [--steps 10] [--milliseconds 3000] [--timeout 8000]
//
// It connects, calls slow({milliseconds, steps}), and once --cut-after
// progress notifications have arrived writes --cut-file, for the caller to
// cut its connection. The SDK's transport resumes a broken stream with a
// GET carrying Last-Event-ID if it got an event ID, and the call fails
// after --timeout otherwise. Prints one JSON line and exits 0:
// {"progress":[...],"result":true|false,"resumptionTokens":n,"error":""}
import fs from 'node:fs';
import { parseArgs } from 'node:util';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string' },
    'cut-file': { type: 'string' },
    'cut-after': { type: 'string', default: '3' },
    steps: { type: 'string', default: '10' },
    milliseconds: { type: 'string', default: '3000' },
    timeout: { type: 'string', default: '8000' },
  },
});
if (!opt.url || !opt['cut-file']) {
  console.error('--url and --cut-file are required');
  process.exit(2);
}

const report = { progress: [], result: false, error: '' };
const client = new Client({ name: 'affinity-test-ts-resume', version: '0.0.0' });
const transport = new StreamableHTTPClientTransport(new URL(opt.url), {
  reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 5 },
});
client.onerror = () => {}; // a broken stream is reported here; the call's outcome is what counts
try {
  await client.connect(transport);
  const res = await client.callTool(
    { name: 'slow', arguments: { milliseconds: Number(opt.milliseconds), steps: Number(opt.steps) } },
    undefined,
    {
      timeout: Number(opt.timeout),
      onprogress: (p) => {
        report.progress.push(p.progress);
        if (report.progress.length === Number(opt['cut-after'])) fs.writeFileSync(opt['cut-file'], 'cut\n');
      },
    },
  );
  report.result = res.content?.[0]?.text === 'done';
} catch (err) {
  report.error = String(err?.message ?? err);
}
console.log(JSON.stringify(report));
await client.close().catch(() => {});
process.exit(0);
