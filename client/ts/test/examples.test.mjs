// examples/mobile-ts, built with tsc and run against a real server over each protocol it
// offers: its printed lines, and the server's counts of what it sent.
import { after, before, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { assertCountsSince, requestCounts, startServer } from "./helpers.mjs";

const example = resolve(dirname(fileURLToPath(import.meta.url)), "../../../examples/mobile-ts");
let server;

before(async () => {
  assert.ok(existsSync(join(example, "node_modules/@crypto-offload/client")), `npm ci in ${example}`);
  execFileSync(process.execPath, [join(example, "node_modules/typescript/bin/tsc"), "-p", example], { stdio: "inherit" });
  server = await startServer([]);
});

after(async () => {
  if (server) assert.equal((await server.stop()).code, 0, server.log());
});

for (const protocol of ["connect", "connect-json", "grpc-web"]) {
  it(`examples/mobile-ts over ${protocol}`, async () => {
    const before = await requestCounts(server);
    const out = execFileSync(process.execPath, [join(example, "dist/main.js")], {
      env: { ...process.env, OFFLOAD_HTTP: server.http, OFFLOAD_PROTOCOL: protocol },
      timeout: 60_000,
    }).toString();
    assert.match(out, /^derive: [0-9a-f]{16}\.\.\. sent true, then from the client's memo true$/m);
    assert.match(out, /^open: "read state" from the client's memo true \(Seal recorded it\)$/m);
    assert.match(out, /^resume \(first\): 27 blobs, 1 request\(s\), 0 from the client's memo$/m);
    assert.match(out, /^resume \(second\): 27 blobs, 0 request\(s\), 27 from the client's memo$/m);
    assert.match(out, /^tampered, then good: error InvalidArgument, "read state"$/m);
    await assertCountsSince(server, before, {
      "KeyService/CreateKey OK": 2,
      "X25519Service/Derive OK": 1,
      "AeadService/Seal OK": 1,
      "AeadService/BatchSeal OK": 1,
      "AeadService/BatchOpen OK": 1,
      "AeadService/Open INVALID_ARGUMENT": 1,
      "KeyService/DeleteKey OK": 2,
    }, protocol);
  });
}
