// HTTP compression on the gateway, against a real server: Accept-Encoding negotiation (q-values,
// identity, *) for Connect and grpc-accept-encoding for gRPC-Web; a 55 KB AEAD Open memo hit
// answered compressed (and smaller) only when its plaintext compresses; compressed requests
// and responses through @connectrpc/connect-node (Connect and gRPC-Web, sendCompression and
// acceptCompression); a gzip bomb refused while the server's resident memory stays flat
// (VmRSS / VmHWM from /proc/<pid>/status). Run: OFFLOAD_SERVER=... node --test test/compression.test.mjs
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { constants as zc, createDeflateRaw, gunzipSync, gzipSync } from "node:zlib";

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import {
  compressionGzip,
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
} from "@connectrpc/connect-node";

import {
  AeadOpenRequestSchema,
  AeadOpenResponseSchema,
  AeadService,
} from "../gen/offload/v1/aead_pb.js";
import { KeyService, KeyType } from "../gen/offload/v1/keys_pb.js";
import { startServer } from "./server.mjs";

const OPEN = "/offload.v1.AeadService/Open";
const SIZE = 55000;

let server;
let grpc; // plain gRPC: keys and seals
const plain = {}; // text (compressible JSON-like), random
const body = {}; // AeadOpenRequest bytes for each

// JSON-like records: a compressible plaintext.
function jsonLike(n) {
  let s = "[";
  for (let i = 0; s.length < n; i++) {
    s += `{"id":${i},"name":"user-${(i * 7919) % 10007}","email":"user${i}@example.com",` +
      `"active":${i % 3 === 0},"score":${(i * 37) % 1000}},`;
  }
  return Buffer.from(s.slice(0, n));
}

// One raw HTTP/1.1 request: { status, headers, body (Buffer) }.
function raw(path, { headers = {}, body: payload = Buffer.alloc(0) } = {}) {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: "127.0.0.1",
        port: server.httpPort,
        path,
        method: "POST",
        headers: { ...headers, "Content-Length": payload.length },
        agent: false,
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on("error", reject);
      },
    );
    req.on("error", (e) => {
      if (!["EPIPE", "ECONNRESET"].includes(e.code)) reject(e);
    });
    req.end(payload);
  });
}

function frame(flags, payload) {
  const b = Buffer.alloc(5 + payload.length);
  b[0] = flags;
  b.writeUInt32BE(payload.length, 1);
  Buffer.from(payload).copy(b, 5);
  return b;
}

// The message frame of a gRPC-Web response: { compressed, message }; checks the OK trailer.
function webMessage(r) {
  const n = r.body.readUInt32BE(1);
  assert.match(r.body.subarray(5 + n + 5).toString(), /^grpc-status: 0\r\n/);
  return { compressed: (r.body[0] & 1) === 1, message: r.body.subarray(5, 5 + n) };
}

function plaintextOf(bytes) {
  const m = fromBinary(AeadOpenResponseSchema, bytes);
  assert.equal(m.memoHit, true, "a 55 KB open memo hit");
  return Buffer.from(m.plaintext);
}

async function scrape() {
  const text = await (await fetch(server.metrics)).text();
  const values = {};
  for (const line of text.split("\n")) {
    if (line.startsWith("offload_http_") && !line.startsWith("#")) {
      const i = line.lastIndexOf(" ");
      values[line.slice(0, i)] = Number(line.slice(i + 1));
    }
  }
  return values;
}
const compressed = 'offload_http_response_compression_total{result="compressed"}';
const incompressible = 'offload_http_response_compression_total{result="incompressible"}';
const sentGzip = 'offload_http_sent_bytes_total{encoding="gzip"}';
const receivedGzip = 'offload_http_received_bytes_total{encoding="gzip"}';

function status(pid) {
  const s = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (name) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(s)[1]);
  return { rss: kb("VmRSS") * 1024, hwm: kb("VmHWM") * 1024, size: kb("VmSize") * 1024 };
}

// A gzip bomb of about `compressedBytes`: 1 MiB of zeros per ~1 KB, as one byte-aligned deflate
// piece (a 1 MiB run of zeros, then a full flush) repeated under a gzip header; the trailer
// (never reached) claims 1000 bytes.
async function gzipBomb(compressedBytes) {
  const piece = await new Promise((resolve) => {
    const d = createDeflateRaw({ level: 9 });
    const out = [];
    d.on("data", (c) => out.push(c));
    d.write(Buffer.alloc(1 << 20));
    d.flush(zc.Z_FULL_FLUSH, () => resolve(Buffer.concat(out)));
  });
  const count = Math.floor(compressedBytes / piece.length);
  const header = Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
  const trailer = Buffer.alloc(8);
  trailer.writeUInt32LE(1000, 4);
  return {
    bytes: Buffer.concat([header, ...Array(count).fill(piece), Buffer.from([3, 0]), trailer]),
    inflated: count * (1 << 20),
  };
}

before(async () => {
  // Default limits: --max_message_bytes 16 MiB, so a 10 MB gzip body is read and inflated.
  server = await startServer([]);
  grpc = {
    keys: createClient(KeyService, createGrpcTransport({ baseUrl: server.grpc, httpVersion: "2" })),
    aead: createClient(AeadService, createGrpcTransport({ baseUrl: server.grpc, httpVersion: "2" })),
  };
  await grpc.keys.createKey({ keyId: "blobs", type: KeyType.XCHACHA20_POLY1305 });
  plain.text = jsonLike(SIZE);
  plain.random = randomBytes(SIZE);
  for (const kind of ["text", "random"]) {
    // Seal records the envelope in the open memo: every Open below is a memo hit.
    const { envelope } = await grpc.aead.seal({ keyId: "blobs", plaintext: plain[kind] });
    body[kind] = Buffer.from(
      toBinary(AeadOpenRequestSchema, create(AeadOpenRequestSchema, { keyId: "blobs", envelope })),
    );
  }
});

after(async () => {
  if (!server) return;
  const { code, signal } = await server.stop();
  assert.equal(signal, null, `server killed by ${signal}:\n${server.log()}`);
  assert.equal(code, 0, `server exit code ${code}:\n${server.log()}`);
});

describe("Connect: Accept-Encoding", () => {
  const post = (kind, accept) =>
    raw(OPEN, {
      headers: { "Content-Type": "application/proto", ...(accept === undefined ? {} : { "Accept-Encoding": accept }) },
      body: body[kind],
    });

  for (const accept of ["gzip", "gzip, deflate, br, zstd", "gzip,br", "*", "br;q=1, gzip;q=0.5", "identity;q=0.1, gzip"]) {
    it(`${JSON.stringify(accept)}: a compressible 55 KB plaintext comes back gzipped, and smaller`, async () => {
      const r = await post("text", accept);
      assert.equal(r.status, 200);
      assert.equal(r.headers["content-encoding"], "gzip");
      assert.ok(r.body.length < SIZE / 3, `gzipped to ${r.body.length} bytes`);
      assert.deepEqual(plaintextOf(gunzipSync(r.body)), plain.text);
    });
  }

  for (const accept of [undefined, "", "identity", "gzip;q=0", "gzip;q=0.000, br", "*;q=0", "br", "gzip;q=0.2, identity;q=0.9"]) {
    it(`${JSON.stringify(accept)}: answered uncompressed`, async () => {
      const r = await post("text", accept);
      assert.equal(r.status, 200);
      assert.equal(r.headers["content-encoding"], undefined);
      assert.deepEqual(plaintextOf(r.body), plain.text);
    });
  }

  it("random 55 KB data is answered uncompressed, though gzip is accepted", async () => {
    const r = await post("random", "gzip");
    assert.equal(r.status, 200);
    assert.equal(r.headers["content-encoding"], undefined);
    assert.equal(r.body.length, SIZE + 8);
    assert.deepEqual(plaintextOf(r.body), plain.random);
  });
});

describe("gRPC-Web: grpc-accept-encoding", () => {
  const post = (kind, headers, contentType = "application/grpc-web+proto") =>
    raw(OPEN, { headers: { "Content-Type": contentType, "X-Grpc-Web": "1", ...headers }, body: frame(0, body[kind]) });

  it("gzip accepted: the message frame is compressed (flag and grpc-encoding)", async () => {
    const r = await post("text", { "grpc-accept-encoding": "gzip" });
    assert.equal(r.status, 200);
    assert.equal(r.headers["grpc-encoding"], "gzip");
    assert.equal(r.headers["content-encoding"], undefined);
    const { compressed: flag, message } = webMessage(r);
    assert.equal(flag, true);
    assert.ok(message.length < SIZE / 3);
    assert.deepEqual(plaintextOf(gunzipSync(message)), plain.text);
  });

  it("not accepted, or random data: the frame is sent as it is", async () => {
    for (const [kind, headers] of [
      ["text", {}],
      ["text", { "Accept-Encoding": "gzip" }], // HTTP's header is not gRPC-Web's
      ["text", { "grpc-accept-encoding": "identity" }],
      ["random", { "grpc-accept-encoding": "gzip" }],
    ]) {
      const r = await post(kind, headers);
      assert.equal(r.status, 200);
      assert.equal(r.headers["grpc-encoding"], undefined, JSON.stringify(headers));
      const { compressed: flag, message } = webMessage(r);
      assert.equal(flag, false);
      assert.deepEqual(plaintextOf(message), plain[kind]);
    }
  });
});

describe("connect-node with compression on", () => {
  // Responses compressed when asked for; requests compressed by the client (compressMinBytes 0:
  // even the small Open requests).
  const gzip = { sendCompression: compressionGzip, compressMinBytes: 0, acceptCompression: [compressionGzip] };
  const variants = [
    { name: "connect, gzip both ways", make: (b) => createConnectTransport({ ...b, ...gzip }), gz: true },
    { name: "connect, acceptCompression []", make: (b) => createConnectTransport({ ...b, acceptCompression: [] }), gz: false },
    { name: "grpc-web, gzip both ways", make: (b) => createGrpcWebTransport({ ...b, ...gzip }), gz: true },
    { name: "grpc-web, acceptCompression []", make: (b) => createGrpcWebTransport({ ...b, acceptCompression: [] }), gz: false },
  ];
  for (const httpVersion of ["1.1", "2"]) {
    for (const { name, make, gz } of variants) {
      it(`${name}, HTTP/${httpVersion}`, async () => {
        const aead = createClient(AeadService, make({ baseUrl: server.http, httpVersion, useBinaryFormat: true }));
        const m0 = await scrape();
        for (const kind of ["text", "random"]) {
          const got = await aead.open(fromBinary(AeadOpenRequestSchema, body[kind]));
          assert.deepEqual(Buffer.from(got.plaintext), plain[kind]);
          assert.equal(got.memoHit, true);
        }
        // A request the server inflates (when compressed): Seal of the compressible plaintext.
        const sealed = await aead.seal({ keyId: "blobs", plaintext: plain.text });
        const back = await grpc.aead.open({ keyId: "blobs", envelope: sealed.envelope });
        assert.deepEqual(Buffer.from(back.plaintext), plain.text);
        const m1 = await scrape();
        const delta = (k) => (m1[k] ?? 0) - (m0[k] ?? 0);
        // Compressed: the text open. Sent as they were: the random open and the seal (ciphertext).
        assert.equal(delta(compressed), gz ? 1 : 0);
        assert.equal(delta(incompressible), gz ? 2 : 0);
        if (gz) assert.ok(delta(sentGzip) > 0 && delta(sentGzip) < SIZE / 3, `${delta(sentGzip)} gzip bytes sent`);
        else assert.equal(delta(sentGzip), 0);
        // The client compressed all three requests (the opens' envelopes do not shrink).
        if (gz) assert.ok(delta(receivedGzip) > 2 * SIZE, `${delta(receivedGzip)} gzip bytes received`);
        else assert.equal(delta(receivedGzip), 0);
      });
    }
  }
});

describe("a gzip bomb", () => {
  it("10 MB of gzip inflating to ~10 GB is refused resource_exhausted, memory flat", async () => {
    const bomb = await gzipBomb(10 * 1000 * 1000);
    assert.ok(bomb.bytes.length < 16 << 20 && bomb.inflated > 9 * 2 ** 30, `${bomb.bytes.length} -> ${bomb.inflated}`);
    // The same bodies, two at a time (the server has two loop threads here), over both
    // protocols; `gzip` false sends them as they are (refused: not a protobuf message).
    const round = (gzip) => {
      const enc = (name) => (gzip ? { [name]: "gzip" } : {});
      return Promise.all([
        raw(OPEN, { headers: { "Content-Type": "application/proto", ...enc("Content-Encoding") }, body: bomb.bytes }),
        raw(OPEN, {
          headers: { "Content-Type": "application/grpc-web+proto", ...enc("grpc-encoding") },
          body: frame(gzip ? 1 : 0, bomb.bytes),
        }),
      ]);
    };
    // Warm-up: reading 10 MB bodies costs memory of its own (the HTTP server's buffers, kept by
    // malloc): in the "before" figure.
    for (let i = 0; i < 3; i++) {
      const [a, b] = await round(false);
      assert.equal(a.status, 400);
      assert.equal(b.headers["grpc-status"], "3"); // INVALID_ARGUMENT
    }
    const before = status(server.pid);
    for (let i = 0; i < 3; i++) {
      const [a, b] = await round(true);
      assert.equal(a.status, 429);
      assert.equal(JSON.parse(a.body.toString()).code, "resource_exhausted");
      assert.match(JSON.parse(a.body.toString()).message, /at most 16777216 bytes once decompressed/);
      assert.equal(b.status, 200);
      assert.equal(b.headers["grpc-status"], "8"); // RESOURCE_EXHAUSTED
    }
    const afterBombs = status(server.pid);
    const mib = (x) => (x / 2 ** 20).toFixed(1);
    console.log(
      `bomb: VmRSS ${mib(before.rss)} -> ${mib(afterBombs.rss)} MiB, VmHWM ${mib(before.hwm)} -> ${mib(afterBombs.hwm)} MiB`,
    );
    // Bounds, not times. Reading the bodies alone moves VmRSS by up to ~10 MiB (malloc keeps a
    // freed 10 MB buffer now and then); inflating to the 16 MiB bound in memory, as Gunzip once
    // did (a std::string growing to the bound), raised VmHWM by 26-46 MiB in this test.
    // A sanitizer build (ASan/TSan reserve terabytes of shadow: VmSize) keeps freed blocks in
    // quarantine, so its RSS follows every 10 MB body: there only the answers are checked.
    if (afterBombs.size > 2 ** 40) {
      console.log("bomb: sanitizer build (VmSize %s GiB): memory bounds not checked", (afterBombs.size / 2 ** 30).toFixed(0));
    } else {
      assert.ok(afterBombs.rss - before.rss < 16 * 2 ** 20, `VmRSS grew by ${mib(afterBombs.rss - before.rss)} MiB`);
      assert.ok(afterBombs.hwm - before.hwm < 16 * 2 ** 20, `VmHWM grew by ${mib(afterBombs.hwm - before.hwm)} MiB`);
    }
    assert.ok(server.alive());
    // And a real compressed request still works after them.
    const r = await raw(OPEN, {
      headers: { "Content-Type": "application/proto", "Content-Encoding": "gzip", "Accept-Encoding": "gzip" },
      body: gzipSync(body.text),
    });
    assert.equal(r.status, 200);
    assert.deepEqual(plaintextOf(gunzipSync(r.body)), plain.text);
  });
});
