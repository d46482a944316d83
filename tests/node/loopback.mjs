// Preloaded into servers we do not control (`node --import ./loopback.mjs
// server.js`): a server that listens on a port without naming a host (as
// server-everything's app.listen(PORT) does, which binds every interface)
// listens on 127.0.0.1 instead. If $MCP_ADDR_FILE is set, the first server
// to listen writes its address there ("127.0.0.1:PORT"), so the caller can
// use PORT=0 and learn the port the kernel picked.
import fs from 'node:fs';
import net from 'node:net';

const listen = net.Server.prototype.listen;
let written = false;

net.Server.prototype.listen = function (...args) {
  const a0 = args[0];
  const isPort = typeof a0 === 'number' || (typeof a0 === 'string' && /^\d+$/.test(a0));
  if (isPort && (args.length === 1 || typeof args[1] === 'function')) {
    args.splice(1, 0, '127.0.0.1');
  } else if (a0 && typeof a0 === 'object' && a0.port !== undefined && !a0.host && !a0.path) {
    args[0] = { ...a0, host: '127.0.0.1' };
  }
  const file = process.env.MCP_ADDR_FILE;
  if (file && !written) {
    written = true;
    this.once('listening', () => {
      const { address, port } = this.address();
      fs.writeFileSync(`${file}.tmp`, `${address}:${port}\n`);
      fs.renameSync(`${file}.tmp`, file);
    });
  }
  return listen.apply(this, args);
};
