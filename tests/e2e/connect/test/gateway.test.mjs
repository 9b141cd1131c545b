// The HTTP gateway (Connect with proto and JSON, gRPC-Web binary, gRPC on our engine) and the gRPC
// port, driven by @connectrpc/connect-node with clients generated from proto/ (see
// ../generate.mjs). Every
// transport must give the same answers as plain gRPC; malformed HTTP requests must get the
// right Connect error and leave the server up. Run: OFFLOAD_SERVER=... npm test
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { generateKeyPairSync, randomBytes } from "node:crypto";
import { request as httpRequest } from "node:http";

import { clone, create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import {
  compressionGzip,
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
} from "@connectrpc/connect-node";

import { AeadService, AeadOpenResponseSchema } from "../gen/offload/v1/aead_pb.js";
import {
  Ed25519Service,
  BatchVerifyResponseSchema,
  VerifyRequestSchema,
  VerifyResponseSchema,
} from "../gen/offload/v1/ed25519_pb.js";
import { KeyService, KeyState, KeyType, KeyInfoSchema } from "../gen/offload/v1/keys_pb.js";
import { DeriveOutput, DeriveResponseSchema, X25519Service } from "../gen/offload/v1/x25519_pb.js";
import { startServer } from "./server.mjs";

const MAX_MESSAGE = 4 << 20; // the server's --max_message_bytes here: a 10 MB body is too large

let server;
let grpc; // the reference: plain gRPC over HTTP/2 on the gRPC port
const transports = {}; // name -> transport on the HTTP port

function clients(transport) {
  return {
    keys: createClient(KeyService, transport),
    ed25519: createClient(Ed25519Service, transport),
    x25519: createClient(X25519Service, transport),
    aead: createClient(AeadService, transport),
  };
}

// A message's bytes with memo_hit cleared: "the same answer" whether or not it came from a memo.
function answer(schema, message) {
  const c = clone(schema, message);
  if ("memoHit" in c) c.memoHit = false;
  if ("results" in c) for (const r of c.results) if ("memoHit" in r) r.memoHit = false;
  return Buffer.from(toBinary(schema, c)).toString("hex");
}

async function codeOf(promise) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof ConnectError, `expected a ConnectError, got ${e}`);
    return e.code;
  }
  return Code.Unknown - 100; // resolved: no error
}

function x25519PublicKey() {
  const { publicKey } = generateKeyPairSync("x25519");
  return Buffer.from(publicKey.export({ format: "jwk" }).x, "base64url");
}

// A raw HTTP/1.1 request: { status, headers, body (Buffer) }. `chunked` sends without
// Content-Length. A server that answers before reading a huge body may close the connection
// while we are still writing it: the response still counts.
function raw(
  path,
  { method = "POST", headers = {}, body = Buffer.alloc(0), chunked = false, waitForResponseBeforeBody = false } = {},
) {
  return new Promise((resolve, reject) => {
    const h = { ...headers };
    if (!chunked) h["Content-Length"] = body.length;
    const req = httpRequest(
      { host: "127.0.0.1", port: server.httpPort, path, method, headers: h, agent: false },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () =>
          resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }),
        );
        res.on("error", reject);
      },
    );
    req.on("error", (e) => {
      if (!["EPIPE", "ECONNRESET"].includes(e.code)) reject(e);
    });
    if (waitForResponseBeforeBody) {
      // Headers only: a server that refuses on Content-Length answers before any body byte;
      // the request is dropped once the answer has been read.
      req.flushHeaders();
      req.on("response", (res) => res.on("end", () => req.destroy()));
      return;
    }
    if (chunked) {
      for (let off = 0; off < body.length; off += 1 << 20) req.write(body.subarray(off, off + (1 << 20)));
      req.end();
    } else {
      req.end(body);
    }
  });
}

function connectError(r) {
  assert.match(r.headers["content-type"] ?? "", /^application\/json/);
  return JSON.parse(r.body.toString());
}

function frame(flags, payload) {
  const b = Buffer.alloc(5 + payload.length);
  b[0] = flags;
  b.writeUInt32BE(payload.length, 1);
  Buffer.from(payload).copy(b, 5);
  return b;
}

const signed = {}; // publicKey, message, signature from the gRPC path

before(async () => {
  // Every call is logged (method, transport, HTTP method and version): the Connect GET checks
  // read the log.
  server = await startServer([`--max_message_bytes=${MAX_MESSAGE}`, "--log_requests_sample_rate=1"]);
  grpc = clients(createGrpcTransport({ baseUrl: server.grpc, httpVersion: "2" }));
  // Every protocol over HTTP/1.1 and over HTTP/2 with prior knowledge (h2c).
  for (const httpVersion of ["1.1", "2"]) {
    const base = { baseUrl: server.http, httpVersion };
    const v = `@h${httpVersion}`;
    transports[`connect+proto${v}`] = createConnectTransport({ ...base, useBinaryFormat: true });
    transports[`connect+json${v}`] = createConnectTransport({ ...base, useBinaryFormat: false });
    transports[`connect+proto+gzip${v}`] = createConnectTransport({
      ...base,
      useBinaryFormat: true,
      sendCompression: compressionGzip,
      compressMinBytes: 0,
    });
    transports[`connect+get${v}`] = createConnectTransport({
      ...base,
      useBinaryFormat: true,
      useHttpGet: true,
    });
    transports[`grpc-web+proto${v}`] = createGrpcWebTransport({ ...base, useBinaryFormat: true });
  }
  // gRPC itself on the HTTP port (HTTP/2 only): our engine, not gRPC 1.51, answers it.
  transports["grpc+proto@h2"] = createGrpcTransport({ baseUrl: server.http, httpVersion: "2" });
  transports["grpc+proto+gzip@h2"] = createGrpcTransport({
    baseUrl: server.http,
    httpVersion: "2",
    sendCompression: compressionGzip,
    compressMinBytes: 0,
  });

  await grpc.keys.createKey({ keyId: "signer", type: KeyType.ED25519 });
  await grpc.keys.createKey({ keyId: "dh", type: KeyType.X25519 });
  await grpc.keys.createKey({ keyId: "blobs", type: KeyType.XCHACHA20_POLY1305 });
  const message = randomBytes(100);
  const s = await grpc.ed25519.sign({ keyId: "signer", message });
  Object.assign(signed, { publicKey: s.publicKey, message, signature: s.signature });
});

after(async () => {
  if (!server) return;
  const { code, signal } = await server.stop();
  assert.equal(signal, null, `server killed by ${signal}:\n${server.log()}`);
  assert.equal(code, 0, `server exit code ${code}:\n${server.log()}`);
  // Nothing secret in the log: no plaintext or message we sent.
  assert.ok(!server.log().includes("hello, gateway"));
});

const names = ["connect+proto", "connect+json", "connect+proto+gzip", "connect+get", "grpc-web+proto"]
  .flatMap((n) => [`${n}@h1.1`, `${n}@h2`])
  .concat(["grpc+proto@h2", "grpc+proto+gzip@h2"]);

describe("every transport answers as plain gRPC", () => {
  for (const name of names) {
    describe(name, () => {
      let c;
      before(() => (c = clients(transports[name])));

      it("Verify", async () => {
        const want = await grpc.ed25519.verify(signed);
        const got = await c.ed25519.verify(signed);
        assert.equal(got.valid, true);
        assert.equal(got.memoHit, true, "the gRPC call's result is in the shared verify memo");
        assert.equal(answer(VerifyResponseSchema, got), answer(VerifyResponseSchema, want));
        const tampered = { ...signed, message: Buffer.from("other") };
        assert.equal((await c.ed25519.verify(tampered)).valid, false);
        assert.equal(
          await codeOf(c.ed25519.verify({ ...signed, publicKey: new Uint8Array(31) })),
          Code.InvalidArgument,
        );
      });

      it("BatchVerify", async () => {
        const items = [
          signed,
          { ...signed, message: Buffer.from("other") },
          { ...signed, signature: new Uint8Array(10) },
          signed,
        ];
        const want = await grpc.ed25519.batchVerify({ items });
        const got = await c.ed25519.batchVerify({ items });
        assert.deepEqual(
          got.results.map((r) => [r.status?.code ?? 0, r.valid]),
          [[0, true], [0, false], [Code.InvalidArgument, false], [0, true]],
        );
        assert.equal(answer(BatchVerifyResponseSchema, got), answer(BatchVerifyResponseSchema, want));
        assert.equal(await codeOf(c.ed25519.batchVerify({ items: [] })), Code.InvalidArgument);
      });

      it("Derive", async () => {
        const peer = x25519PublicKey();
        for (const output of [DeriveOutput.RAW, DeriveOutput.BOX_BEFORENM]) {
          const want = await grpc.x25519.derive({ keyId: "dh", peerPublicKey: peer, output });
          const got = await c.x25519.derive({ keyId: "dh", peerPublicKey: peer, output });
          assert.equal(got.sharedKey.length, 32);
          assert.equal(got.memoHit, true, "derived once over gRPC, then from the derive memo");
          assert.equal(answer(DeriveResponseSchema, got), answer(DeriveResponseSchema, want));
        }
        assert.equal(
          await codeOf(c.x25519.derive({ keyId: "nobody", peerPublicKey: peer, output: DeriveOutput.RAW })),
          await codeOf(grpc.x25519.derive({ keyId: "nobody", peerPublicKey: peer, output: DeriveOutput.RAW })),
        );
      });

      it("AEAD Seal and Open", async () => {
        const plaintext = Buffer.from(`hello, gateway ${name}`);
        const associatedData = Buffer.from("user-42");
        // Sealed over gRPC, opened here; sealed here, opened over gRPC.
        const fromGrpc = await grpc.aead.seal({ keyId: "blobs", plaintext, associatedData });
        const want = await grpc.aead.open({ keyId: "blobs", envelope: fromGrpc.envelope, associatedData });
        const got = await c.aead.open({ keyId: "blobs", envelope: fromGrpc.envelope, associatedData });
        assert.deepEqual(Buffer.from(got.plaintext), plaintext);
        assert.equal(answer(AeadOpenResponseSchema, got), answer(AeadOpenResponseSchema, want));
        const sealed = await c.aead.seal({ keyId: "blobs", plaintext, associatedData });
        const back = await grpc.aead.open({ keyId: "blobs", envelope: sealed.envelope, associatedData });
        assert.deepEqual(Buffer.from(back.plaintext), plaintext);
        assert.equal(back.memoHit, true, "Seal recorded its envelope in the open memo");
        // A tampered envelope fails the same way on both paths.
        const bad = Buffer.from(sealed.envelope);
        bad[bad.length - 1] ^= 1;
        const wantCode = await codeOf(grpc.aead.open({ keyId: "blobs", envelope: bad, associatedData }));
        assert.notEqual(wantCode, Code.Unknown - 100);
        assert.equal(await codeOf(c.aead.open({ keyId: "blobs", envelope: bad, associatedData })), wantCode);
        // A large message (gzip on responses when accepted).
        const big = randomBytes(200000);
        const env = await c.aead.seal({ keyId: "blobs", plaintext: big });
        assert.deepEqual(Buffer.from((await c.aead.open({ keyId: "blobs", envelope: env.envelope })).plaintext), big);
      });

      it("key creation", async () => {
        const keyId = `k-${name.replace(/[^a-z0-9]/g, "-")}`;
        const made = await c.keys.createKey({ keyId, type: KeyType.ED25519 });
        assert.equal(made.keyId, keyId);
        const info = await grpc.keys.getKey({ keyId });
        assert.equal(
          Buffer.from(toBinary(KeyInfoSchema, made)).toString("hex"),
          Buffer.from(toBinary(KeyInfoSchema, info)).toString("hex"),
        );
        assert.equal(await codeOf(c.keys.createKey({ keyId, type: KeyType.ED25519 })), Code.AlreadyExists);
        assert.equal(await codeOf(c.keys.getKey({ keyId: "no-such-key" })), Code.NotFound);
        // Deletion is scheduled: the key stays, refusing calls, until the wait ends or it is
        // cancelled.
        const deleted = await c.keys.deleteKey({ keyId });
        assert.equal(deleted.key.state, KeyState.PENDING_DELETION);
        assert.ok(Number(deleted.deletionUnixSeconds) > Date.now() / 1000);
        assert.equal((await grpc.keys.getKey({ keyId })).state, KeyState.PENDING_DELETION);
        assert.equal(await codeOf(c.ed25519.sign({ keyId, message: new Uint8Array(1) })),
                     Code.FailedPrecondition);
        assert.equal(await codeOf(c.keys.deleteKey({ keyId })), Code.FailedPrecondition);
        assert.equal((await c.keys.cancelKeyDeletion({ keyId })).state, KeyState.ENABLED);
        await c.keys.deleteKey({ keyId });
      });

      it("deadline", async () => {
        // A deadline already spent when the call arrives, as the protocol carries it (a phone
        // whose clock-driven budget ran out in a queue): DEADLINE_EXCEEDED, by the server, over
        // every transport. (A 1 ms client timeout raced a memo hit's sub-millisecond answer.)
        const spent = name.startsWith("grpc") ? { "grpc-timeout": "0m" } : { "connect-timeout-ms": "0" };
        const code = await codeOf(c.ed25519.verify(signed, { headers: spent }));
        assert.equal(code, Code.DeadlineExceeded);
      });
    });
  }
});

describe("Connect GET", () => {
  it("connect-node sent the side-effect-free methods by GET (over both HTTP versions), no other", () => {
    const seen = new Set();
    for (const line of server.log().split("\n")) {
      if (!line.includes('"event":"request"') || !line.includes('"transport":"connect"')) continue;
      const r = JSON.parse(line);
      seen.add(`${r.http_method} ${r.method} ${r.http_version}`);
    }
    for (const m of ["Ed25519Service/Verify", "Ed25519Service/BatchVerify", "KeyService/GetKey"]) {
      for (const v of ["1.1", "2"]) assert.ok(seen.has(`GET /offload.v1.${m} ${v}`), `${m} over HTTP/${v}`);
    }
    for (const entry of seen) {
      if (!entry.startsWith("GET ")) continue;
      assert.match(entry, /(Verify|BatchVerify|GetKey|ListKeys) /, entry);
    }
  });

  it("ListKeys by GET, JSON in the query; verify answers are cacheable, key listings are not", async () => {
    const list = await raw("/offload.v1.KeyService/ListKeys?connect=v1&encoding=json&message=%7B%7D", { method: "GET" });
    assert.equal(list.status, 200);
    assert.ok(JSON.parse(list.body.toString()).keys.some((k) => k.keyId === "signer"));
    assert.equal(list.headers["cache-control"], "private, no-cache");
    const request = toBinary(VerifyRequestSchema, create(VerifyRequestSchema, signed));
    const message = Buffer.from(request).toString("base64url");
    const v = await raw(`/offload.v1.Ed25519Service/Verify?connect=v1&encoding=proto&base64=1&message=${message}`, {
      method: "GET",
    });
    assert.equal(v.status, 200);
    assert.equal(fromBinary(VerifyResponseSchema, v.body).valid, true);
    assert.match(v.headers["cache-control"], /max-age=31536000/);
    assert.equal(await codeOf(clients(transports["connect+get@h2"]).keys.getKey({ keyId: "nobody" })), Code.NotFound);
  });
});

describe("malformed HTTP requests get the right Connect error", () => {
  const verify = "/offload.v1.Ed25519Service/Verify";
  const proto = () => Buffer.from(toBinary(VerifyRequestSchema, create(VerifyRequestSchema, signed)));

  it("wrong content type: 415", async () => {
    const r = await raw(verify, { headers: { "Content-Type": "text/plain" }, body: proto() });
    assert.equal(r.status, 415);
    assert.equal(connectError(r).code, "unimplemented");
    assert.match(r.headers["accept-post"], /application\/proto/);
  });

  it("truncated body: invalid_argument", async () => {
    const body = proto();
    let r = await raw(verify, { headers: { "Content-Type": "application/proto" }, body: body.subarray(0, body.length - 7) });
    assert.equal(r.status, 400);
    assert.equal(connectError(r).code, "invalid_argument");
    // gRPC-Web: a frame shorter than its length prefix.
    const f = frame(0, body);
    r = await raw(verify, { headers: { "Content-Type": "application/grpc-web+proto" }, body: f.subarray(0, f.length - 5) });
    assert.equal(r.status, 200);
    assert.equal(r.headers["grpc-status"], String(Code.InvalidArgument));
    assert.match(decodeURIComponent(r.headers["grpc-message"]), /truncated/);
  });

  it("a body over the message limit: resource_exhausted (429), with and without Content-Length", async () => {
    const over = Buffer.alloc(MAX_MESSAGE + 100000, 1);
    for (const chunked of [false, true]) {
      const r = await raw(verify, { headers: { "Content-Type": "application/proto" }, body: over, chunked });
      assert.equal(r.status, 429, `chunked=${chunked}`);
      assert.equal(connectError(r).code, "resource_exhausted");
    }
    const r = await raw(verify, { headers: { "Content-Type": "application/grpc-web" }, body: over });
    assert.equal(r.status, 200);
    assert.equal(r.headers["grpc-status"], String(Code.ResourceExhausted));
  });

  it("a 10 MB body, more than any protocol carries: resource_exhausted before the body is read", async () => {
    // The HTTP server stops at its Content-Length, without buffering it, and the answer is the
    // protocol's own error, not a bare 413.
    for (const [type, check] of [
      ["application/proto", (r) => {
        assert.equal(r.status, 429);
        assert.equal(connectError(r).code, "resource_exhausted");
      }],
      ["application/grpc-web+proto", (r) => {
        assert.equal(r.status, 200);
        assert.equal(r.headers["grpc-status"], String(Code.ResourceExhausted));
      }],
    ]) {
      const r = await raw(verify, {
        headers: { "Content-Type": type },
        body: Buffer.alloc(10 * 1000 * 1000, 1),
        waitForResponseBeforeBody: true,
      });
      check(r);
    }
  });

  it("bad JSON and unknown fields: invalid_argument", async () => {
    for (const body of ['{"publicKey": ', '{"noSuchField": 1}', '{"publicKey": "not base64!"}', "[]"]) {
      const r = await raw(verify, { headers: { "Content-Type": "application/json" }, body: Buffer.from(body) });
      assert.equal(r.status, 400, body);
      assert.equal(connectError(r).code, "invalid_argument", body);
    }
  });

  it("unknown method: 404 unimplemented", async () => {
    for (const path of ["/offload.v1.Ed25519Service/Nope", "/offload.v1.Nope/Verify", "/"]) {
      const r = await raw(path, { headers: { "Content-Type": "application/proto" }, body: proto() });
      assert.equal(r.status, 404, path);
      assert.equal(connectError(r).code, "unimplemented", path);
    }
  });

  it("wrong Connect-Protocol-Version: invalid_argument", async () => {
    const r = await raw(verify, {
      headers: { "Content-Type": "application/proto", "Connect-Protocol-Version": "2" },
      body: proto(),
    });
    assert.equal(r.status, 400);
    assert.equal(connectError(r).code, "invalid_argument");
  });

  it("unknown content encoding: unimplemented", async () => {
    const r = await raw(verify, {
      headers: { "Content-Type": "application/proto", "Content-Encoding": "br" },
      body: proto(),
    });
    assert.equal(r.status, 501);
    assert.equal(connectError(r).code, "unimplemented");
  });

  it("GET of a method with side effects: 405", async () => {
    for (const path of ["/offload.v1.Ed25519Service/Sign", "/offload.v1.KeyService/DeleteKey", "/offload.v1.AeadService/Open"]) {
      const r = await raw(`${path}?connect=v1&encoding=json&message=%7B%7D`, { method: "GET" });
      assert.equal(r.status, 405, path);
      assert.equal(r.headers.allow, "POST", path);
    }
  });

  it("gRPC-Web text (base64 bodies)", async () => {
    const r = await raw(verify, {
      headers: { "Content-Type": "application/grpc-web-text", "X-Grpc-Web": "1" },
      body: Buffer.from(frame(0, proto()).toString("base64")),
    });
    assert.equal(r.status, 200);
    assert.equal(r.headers["content-type"], "application/grpc-web-text+proto");
    const bytes = Buffer.from(r.body.toString(), "base64");
    const n = bytes.readUInt32BE(1);
    const got = fromBinary(VerifyResponseSchema, bytes.subarray(5, 5 + n));
    assert.equal(got.valid, true);
    assert.match(bytes.subarray(5 + n + 5).toString(), /^grpc-status: 0\r\n/);
  });

  it("the server is still up and serving", async () => {
    assert.ok(server.alive());
    assert.equal((await fetch(`${server.http}/healthz`)).status, 200);
    assert.equal((await fetch(`${server.http}/readyz`)).status, 200);
    const r = await raw(verify, { headers: { "Content-Type": "application/proto" }, body: proto() });
    assert.equal(r.status, 200);
  });
});

describe("metrics", () => {
  it("HTTP calls count in the same series as gRPC calls", async () => {
    const text = await (await fetch(server.metrics)).text();
    const line = text
      .split("\n")
      .find((l) => l.startsWith("offload_requests_total{") && l.includes('method="Verify"') && /code="(OK|ok)"/.test(l));
    assert.ok(line, "a Verify OK series");
    // gRPC + 10 HTTP transports x 2 successful Verify calls each, and more.
    assert.ok(Number(line.split(" ").pop()) >= 21, line);
  });
});
