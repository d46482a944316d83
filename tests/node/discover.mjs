// discover.mjs: the TypeScript SDK client's OAuth discovery for an MCP
// server URL, as a client does before its first authorized request:
// discoverOAuthServerInfo (RFC 9728 protected-resource metadata, path-aware
// first, then the root; then RFC 8414 authorization-server metadata), and
// selectResourceURL, which refuses metadata whose resource does not match
// the URL the client was given.
//
// Usage: node discover.mjs --url URL
// Prints one JSON line: {"resource", "authorizationServer", "issuer"} on
// success, or {"error"} with the SDK's message.
import { parseArgs } from 'node:util';
import { discoverOAuthServerInfo, discoverOAuthProtectedResourceMetadata, selectResourceURL } from '@modelcontextprotocol/sdk/client/auth.js';

const { values: opt } = parseArgs({ options: { url: { type: 'string' } } });

try {
  // discoverOAuthServerInfo swallows a failed resource discovery (it then
  // treats the MCP server as its own authorization server), so ask for the
  // resource metadata first, to report its failure.
  const resourceMetadata = await discoverOAuthProtectedResourceMetadata(opt.url);
  const info = await discoverOAuthServerInfo(opt.url);
  const resource = await selectResourceURL(opt.url, {}, resourceMetadata);
  console.log(
    JSON.stringify({
      resource: resource?.href ?? '',
      authorizationServer: info.authorizationServerUrl,
      issuer: info.authorizationServerMetadata?.issuer ?? '',
    }),
  );
} catch (err) {
  console.log(JSON.stringify({ error: String(err?.message ?? err) }));
}
