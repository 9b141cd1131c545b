// Shared by the client's tests: a real offload_server on loopback (tests/e2e/connect's
// startServer), its request counts from /metrics, an admin client that the client under test
// knows nothing of, 55 KB blobs, and EdDSA tokens signed with node:crypto.
import assert from "node:assert/strict";
import { generateKeyPairSync, randomBytes, sign } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { createOffloadClient, KeyType } from "../dist/node.js";
import { createNodeTransport } from "../dist/node.js";
import { startServer } from "../../../tests/e2e/connect/test/server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
process.env.OFFLOAD_SERVER ??= resolve(here, "../../../build/bin/offload_server");
export { startServer };

// RPCs the server finished, from its Prometheus text: "Service/Method CODE" -> count.
export async function requestCounts(server) {
  const text = await (await fetch(server.metrics)).text();
  const counts = {};
  for (const m of text.matchAll(/^offload_requests_total\{([^}]*)\} (\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    const n = Number(m[2]);
    if (n > 0) counts[`${labels.service.replace(/^offload\.v1\./, "")}/${labels.method} ${labels.code}`] = n;
  }
  return counts;
}

// What the server finished since `before` (a requestCounts result): only the series that moved.
export async function countsSince(server, before) {
  const now = await requestCounts(server);
  const delta = {};
  for (const [k, v] of Object.entries(now)) if (v !== (before[k] ?? 0)) delta[k] = v - (before[k] ?? 0);
  return delta;
}

// Asserts that the server finished exactly `expected` since `before` (the last counter may be
// bumped a moment after the answer: re-read for up to 5 s while it differs).
export async function assertCountsSince(server, before, expected, what) {
  let delta;
  for (const until = Date.now() + 5000; ; await new Promise((r) => setTimeout(r, 50))) {
    delta = await countsSince(server, before);
    try {
      assert.deepEqual(delta, expected);
      return;
    } catch (e) {
      if (Date.now() > until) throw new assert.AssertionError({ message: `${what}: ${e.message}`, actual: delta, expected });
    }
  }
}

// A client of the server that the client under test does not share anything with: keys are
// made, blobs sealed and keys disabled through it. gRPC on the gRPC port, no memo.
export function adminClient(server) {
  return createOffloadClient({
    transport: createNodeTransport({ baseUrl: server.grpc, protocol: "grpc" }),
    memo: { verify: false },
    batching: false,
  });
}

let keySerial = 0;
export async function newKey(admin, prefix, type = KeyType.XCHACHA20_POLY1305) {
  const keyId = `${prefix}-${process.pid}-${++keySerial}`;
  await admin.services.keys.createKey({ keyId, type });
  return keyId;
}

// `n` random plaintexts of 54,000-56,000 bytes sealed under `keyId` (by `admin`), with their
// associated data: what a phone keeps on disk and re-reads on every resume.
export async function makeBlobs(admin, keyId, n, seed = 0) {
  const blobs = [];
  for (let i = 0; i < n; i++) {
    const plaintext = randomBytes(54000 + ((i * 977 + seed * 31) % 2001));
    const associatedData = Buffer.from(`user-42/blob-${i}`);
    const { envelope } = await admin.seal({ keyId, plaintext, associatedData });
    blobs.push({ keyId, envelope, associatedData, plaintext });
  }
  return blobs;
}

// An issuer for --jwks_file: `token({ expired, sub })` is an EdDSA JWT for `sub` (by default
// the issuer's). `policy`: the --policy_file's grants (default: `sub` is an admin granted all).
export function tokenIssuer(sub = "ts-client", policy = { admins: [sub], grants: [{ client: sub, keys: ["*"], operations: ["*"] }] }) {
  const dir = mkdtempSync(join(tmpdir(), "offload-ts-tokens-"));
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const jwks = join(dir, "jwks.json");
  writeFileSync(jwks, JSON.stringify({ keys: [{ ...publicKey.export({ format: "jwk" }), kid: "ts-1" }] }));
  const policyFile = join(dir, "policy.json");
  writeFileSync(policyFile, JSON.stringify(policy));
  const issuer = "https://id.ts-client.test";
  const audience = "crypto-offload";
  const b64 = (x) => Buffer.from(x).toString("base64url");
  return {
    flags: [`--jwks_file=${jwks}`, `--token_issuer=${issuer}`, `--token_audience=${audience}`, `--policy_file=${policyFile}`, "--require_identity"],
    token({ expired = false, sub: subject = sub } = {}) {
      const now = Math.floor(Date.now() / 1000);
      const exp = expired ? now - 3600 : now + 600;
      const input = `${b64(JSON.stringify({ alg: "EdDSA", typ: "JWT", kid: "ts-1" }))}.` +
        b64(JSON.stringify({ iss: issuer, aud: audience, sub: subject, exp, iat: exp - 600, nonce: randomBytes(4).toString("hex") }));
      return `${input}.${b64(sign(null, Buffer.from(input), privateKey))}`;
    },
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}

// A clock the test moves: memo ages without sleeping.
export function manualClock(start = 1_000_000) {
  let t = start;
  return { now: () => t, advance: (ms) => (t += ms) };
}
