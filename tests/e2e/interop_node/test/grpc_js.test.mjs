// Interop of the gRPC port on our engine with @grpc/grpc-js, the
// Node.js gRPC implementation, on clients built at run time by @grpc/proto-loader from proto/:
// answers, status codes and messages, deadlines, cancellation, gzip both ways, text and -bin
// metadata, messages at and over --max_message_bytes, a health Watch across a drain, and server
// reflection v1 down to a call built only from the descriptors it returned. Asserts answers,
// codes and counts, never a time. Run: OFFLOAD_SERVER=... node --test test/grpc_js.test.mjs
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createPublicKey, generateKeyPairSync, randomBytes, sign as nodeSign, verify as nodeVerify } from "node:crypto";
import { createServer, connect } from "node:net";

import { create, createFileRegistry, fromBinary, toBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";

import {
  MAX_MESSAGE,
  channelOptions,
  clients,
  deadline,
  failure,
  grpc,
  protoServices,
  startEngineServer,
  target,
  unary,
} from "./common.mjs";

const { status: Status } = grpc;

// A raw 32-byte Ed25519 public key from node's KeyObject, and the reverse.
function rawPublicKey(keyObject) {
  return Buffer.from(keyObject.export({ format: "jwk" }).x, "base64url");
}
function publicKeyObject(raw) {
  return createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(raw).toString("base64url") }, format: "jwk" });
}

// A loopback TCP relay to `port` that counts the bytes each way, so a test can see what went on
// the wire (gzip or not) without trusting either end. `counts()` is { up, down } so far.
async function byteCounter(port) {
  let up = 0;
  let down = 0;
  const sockets = new Set();
  const relay = createServer((client) => {
    const upstream = connect(port, "127.0.0.1");
    sockets.add(client).add(upstream);
    client.on("data", (d) => (up += d.length));
    upstream.on("data", (d) => (down += d.length));
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", end).on("close", end);
    upstream.on("error", end).on("close", end);
  });
  await new Promise((r) => relay.listen(0, "127.0.0.1", r));
  return {
    address: `127.0.0.1:${relay.address().port}`,
    counts: () => ({ up, down }),
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((r) => relay.close(r));
    },
  };
}

describe("grpc-js against the gRPC port on the engine", () => {
  let server;
  let c; // clients on the gRPC port
  let publicKey; // of the Ed25519 key "signer"

  before(async () => {
    server = await startEngineServer();
    c = clients(target(server.grpc));
    const info = await unary(c.keys, "CreateKey", { key_id: "signer", type: "KEY_TYPE_ED25519" });
    publicKey = info.versions[0].public_key;
    await unary(c.keys, "CreateKey", { key_id: "box", type: "KEY_TYPE_CHACHA20_POLY1305" });
  });

  after(async () => {
    c?.close();
    if (server) {
      const { code } = await server.stop();
      assert.equal(code, 0, "the server exits 0 on SIGTERM");
    }
  });

  it("unary calls give correct answers: Ed25519 Sign/Verify, cross-checked with node:crypto", async () => {
    assert.equal(publicKey.length, 32);
    const message = Buffer.from("grpc-js says hello");
    const { signature, public_key: signedBy, key_version } = await unary(c.ed25519, "Sign", { key_id: "signer", message });
    assert.equal(signature.length, 64);
    assert.equal(key_version, 1);
    assert.deepEqual(signedBy, publicKey);
    // The server's signature verifies under node's own Ed25519 ...
    assert.equal(nodeVerify(null, message, publicKeyObject(publicKey), signature), true);
    // ... and the server verifies node's signatures: valid, then a tampered message.
    const mine = generateKeyPairSync("ed25519");
    const theirs = nodeSign(null, message, mine.privateKey);
    const pk = rawPublicKey(mine.publicKey);
    assert.equal((await unary(c.ed25519, "Verify", { public_key: pk, message, signature: theirs })).valid, true);
    const tampered = Buffer.concat([message, Buffer.from("!")]);
    assert.equal((await unary(c.ed25519, "Verify", { public_key: pk, message: tampered, signature: theirs })).valid, false);
    // The same twice: the second answer comes from the verify memo, and is the same answer.
    const again = await unary(c.ed25519, "Verify", { public_key: publicKey, message, signature });
    assert.equal(again.valid, true);
    assert.equal((await unary(c.ed25519, "Verify", { public_key: publicKey, message, signature })).memo_hit, true);
    // A batch: one result per item, in order.
    const items = Array.from({ length: 32 }, (_, i) => ({
      public_key: publicKey,
      message: i % 3 ? message : tampered,
      signature,
    }));
    const batch = await unary(c.ed25519, "BatchVerify", { items });
    assert.deepEqual(batch.results.map((r) => r.valid), items.map((_, i) => i % 3 !== 0));
    assert.ok(batch.results.every((r) => r.status === null || r.status.code === 0));
  });

  it("unary calls give correct answers: AEAD Seal/Open", async () => {
    const plaintext = randomBytes(55 * 1024);
    const associated_data = Buffer.from("header v1");
    const sealed = await unary(c.aead, "Seal", { key_id: "box", plaintext, associated_data });
    assert.equal(sealed.key_version, 1);
    assert.equal(sealed.envelope.length, 5 + 12 + plaintext.length + 16);
    assert.equal(sealed.envelope[0], 0x01); // format version
    assert.equal(sealed.envelope.readUInt32BE(1), 1); // key version
    const opened = await unary(c.aead, "Open", { key_id: "box", envelope: sealed.envelope, associated_data });
    assert.deepEqual(opened.plaintext, plaintext);
    assert.equal(opened.key_version, 1);
    // Other associated data: the tag does not verify.
    const e = await failure(
      unary(c.aead, "Open", { key_id: "box", envelope: sealed.envelope, associated_data: Buffer.from("header v2") }),
    );
    assert.equal(e.code, Status.INVALID_ARGUMENT);
    assert.match(e.details, /authentication failed/);
  });

  it("status errors keep their code and name the field", async () => {
    let e = await failure(
      unary(c.ed25519, "Verify", { public_key: Buffer.from("short"), message: Buffer.from("m"), signature: Buffer.alloc(64) }),
    );
    assert.equal(e.code, Status.INVALID_ARGUMENT);
    assert.match(e.details, /public_key/);
    assert.match(e.details, /32/);
    e = await failure(
      unary(c.ed25519, "Verify", { public_key: publicKey, message: Buffer.from("m"), signature: Buffer.alloc(63) }),
    );
    assert.equal(e.code, Status.INVALID_ARGUMENT);
    assert.match(e.details, /signature/);
    e = await failure(unary(c.ed25519, "Sign", { key_id: "no-such-key", message: Buffer.from("m") }));
    assert.equal(e.code, Status.NOT_FOUND);
    assert.match(e.details, /no-such-key/);
    e = await failure(unary(c.ed25519, "Sign", { key_id: "box", message: Buffer.from("m") })); // an AEAD key
    assert.equal(e.code, Status.FAILED_PRECONDITION);
    e = await failure(unary(c.keys, "CreateKey", { key_id: "signer", type: "KEY_TYPE_ED25519" }));
    assert.equal(e.code, Status.ALREADY_EXISTS);
    // A method the server does not have.
    const unknown = new grpc.Client(target(server.grpc), grpc.credentials.createInsecure(), channelOptions);
    try {
      e = await failure(
        new Promise((resolve, reject) =>
          unknown.makeUnaryRequest("/offload.v1.Ed25519Service/Nope", (b) => b, (b) => b, Buffer.alloc(0), { deadline: deadline() },
            (err, r) => (err ? reject(err) : resolve(r))),
        ),
      );
      assert.equal(e.code, Status.UNIMPLEMENTED);
      assert.match(e.details, /Nope/);
    } finally {
      unknown.close();
    }
  });

  // 1024 verifications no memo can answer (fresh messages; invalid results are never cached):
  // work that cannot be done in a millisecond.
  function slowBatch() {
    const signature = randomBytes(64);
    signature[63] &= 0x0f; // canonical S: the check runs the full equation
    return {
      items: Array.from({ length: 1024 }, () => ({ public_key: publicKey, message: randomBytes(64), signature })),
    };
  }

  it("a tiny deadline on slow work: DEADLINE_EXCEEDED, and the channel goes on", async () => {
    const e = await failure(unary(c.ed25519, "BatchVerify", slowBatch(), { deadline: new Date(Date.now() + 1) }));
    assert.equal(e.code, Status.DEADLINE_EXCEEDED, `${e.code} ${e.details}`);
    const ok = await unary(c.health, "Check", { service: "" });
    assert.equal(ok.status, "SERVING");
  });

  it("client cancellation of an in-flight call: CANCELLED, and the server goes on", async () => {
    // A unary call cancelled once its request is on the way.
    const call = c.ed25519.BatchVerify(slowBatch(), new grpc.Metadata(), { deadline: deadline() }, () => {});
    const unaryStatus = new Promise((resolve) => call.on("status", resolve));
    setImmediate(() => call.cancel());
    assert.equal((await unaryStatus).code, Status.CANCELLED);

    // A server stream that is certainly in flight (its first answer arrived), then cancelled.
    const watch = c.health.Watch({ service: "offload.v1.Ed25519Service" }, { deadline: deadline() });
    const first = await new Promise((resolve, reject) => {
      watch.once("data", resolve);
      watch.once("error", reject);
    });
    assert.equal(first.status, "SERVING");
    const watchError = new Promise((resolve) => watch.on("error", resolve));
    watch.cancel();
    assert.equal((await watchError).code, Status.CANCELLED);

    // The connection and the server are fine, and the cancelled batch was not answered OK.
    const message = Buffer.from("after cancel");
    const { signature } = await unary(c.ed25519, "Sign", { key_id: "signer", message });
    assert.equal((await unary(c.ed25519, "Verify", { public_key: publicKey, message, signature })).valid, true);
  });

  it("gzip both ways: grpc-js compresses its requests and the server its answers", async () => {
    const relay = await byteCounter(new URL(server.grpc).port);
    // Compressible: 60 KB of text lines.
    const plaintext = Buffer.from("a compressible line of text, as JSON state blobs are\n".repeat(1200)).subarray(0, 60000);
    const gz = clients(relay.address, { "grpc.default_compression_algorithm": 2 /* gzip */ });
    try {
      // Seal: the request (the plaintext) goes gzipped; the answer (ciphertext) cannot shrink.
      await unary(gz.health, "Check", { service: "" }); // the connection is up: count from here
      let before = relay.counts();
      const { envelope } = await unary(gz.aead, "Seal", { key_id: "box", plaintext });
      let after = relay.counts();
      assert.ok(after.up - before.up < 20000, `request of ${after.up - before.up} bytes for a 60000-byte plaintext`);
      assert.ok(after.down - before.down > 60000, "a ciphertext does not compress");
      // Open: the answer (the plaintext) comes back gzipped, and decompresses to the plaintext.
      before = relay.counts();
      const opened = await unary(gz.aead, "Open", { key_id: "box", envelope });
      after = relay.counts();
      assert.deepEqual(opened.plaintext, plaintext);
      assert.ok(after.down - before.down < 20000, `answer of ${after.down - before.down} bytes for a 60000-byte plaintext`);
      // The control: a random plaintext is sent and answered at its size.
      const random = randomBytes(60000);
      before = relay.counts();
      const sealed = await unary(gz.aead, "Seal", { key_id: "box", plaintext: random });
      const back = await unary(gz.aead, "Open", { key_id: "box", envelope: sealed.envelope });
      after = relay.counts();
      assert.deepEqual(back.plaintext, random);
      assert.ok(after.down - before.down > 2 * 60000, "the relay counts what passes");
    } finally {
      gz.close();
      await relay.close();
    }
  });

  it("text and -bin metadata pass, and the answer is right", async () => {
    const md = new grpc.Metadata();
    md.set("x-trace", "trace-0001");
    md.add("x-tags", "alpha");
    md.add("x-tags", "beta");
    md.set("x-trace-bin", Buffer.from([0x00, 0x01, 0xff, 0x0a, 0x0d]));
    md.add("x-blob-bin", Buffer.from(Array.from({ length: 256 }, (_, i) => i)));
    md.add("x-blob-bin", randomBytes(1024));
    const message = Buffer.from("with metadata");
    let headers;
    const response = await new Promise((resolve, reject) => {
      const call = c.ed25519.Sign({ key_id: "signer", message }, md, { deadline: deadline() }, (err, r) =>
        err ? reject(err) : resolve(r),
      );
      call.on("metadata", (m) => (headers = m));
    });
    assert.equal(nodeVerify(null, message, publicKeyObject(publicKey), response.signature), true);
    assert.ok(headers instanceof grpc.Metadata, "response headers arrived");
  });

  it("a message just under --max_message_bytes passes both ways; one over it is RESOURCE_EXHAUSTED", async () => {
    // The request (plaintext + key id + tags) and the answer (envelope: 33 bytes more) both stay
    // just under 16 MiB.
    const plaintext = randomBytes(MAX_MESSAGE - 128);
    plaintext[0] = 0x42;
    const { envelope } = await unary(c.aead, "Seal", { key_id: "box", plaintext });
    assert.equal(envelope.length, plaintext.length + 33);
    const opened = await unary(c.aead, "Open", { key_id: "box", envelope });
    assert.equal(opened.plaintext.length, plaintext.length);
    assert.ok(opened.plaintext.equals(plaintext));

    const e = await failure(unary(c.aead, "Seal", { key_id: "box", plaintext: Buffer.alloc(MAX_MESSAGE + 1) }));
    assert.equal(e.code, Status.RESOURCE_EXHAUSTED, `${e.code} ${e.details}`);
    // The channel is still good.
    assert.equal((await unary(c.health, "Check", { service: "offload.v1.AeadService" })).status, "SERVING");
  });

  it("server reflection v1: list, file_containing_symbol, then a call built from the returned descriptors", async () => {
    const stream = c.reflection.ServerReflectionInfo({ deadline: deadline() });
    const answers = [];
    const waiters = [];
    stream.on("data", (m) => (waiters.length ? waiters.shift()(m) : answers.push(m)));
    const ended = new Promise((resolve, reject) => {
      stream.on("error", reject);
      stream.on("status", resolve);
    });
    const ask = (request) => {
      stream.write(request);
      return answers.length ? Promise.resolve(answers.shift()) : new Promise((r) => waiters.push(r));
    };

    const list = await ask({ list_services: "" });
    assert.equal(list.message_response, "list_services_response");
    const names = list.list_services_response.service.map((s) => s.name);
    for (const s of [...protoServices(), "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"]) {
      assert.ok(names.includes(s), `${s} listed (got ${names})`);
    }

    const files = await ask({ file_containing_symbol: "offload.v1.Ed25519Service" });
    assert.equal(files.message_response, "file_descriptor_response", JSON.stringify(files.error_response));
    const protos = files.file_descriptor_response.file_descriptor_proto.map((b) => fromBinary(FileDescriptorProtoSchema, b));
    assert.ok(protos.some((f) => f.name === "offload/v1/ed25519.proto"));
    assert.ok(protos.some((f) => f.name === "offload/v1/common.proto"), "its import came with it");
    const missing = await ask({ file_containing_symbol: "offload.v1.NoSuchService" });
    assert.equal(missing.message_response, "error_response");
    assert.equal(missing.error_response.error_code, Status.NOT_FOUND);
    stream.end();
    assert.equal((await ended).code, Status.OK);

    // Types from the descriptors alone, as grpcurl would build them (the file asked for, its
    // imports resolved among the files sent with it); a generic client.
    const byName = new Map(protos.map((f) => [f.name, f]));
    const registry = createFileRegistry(byName.get("offload/v1/ed25519.proto"), (name) => byName.get(name));
    const service = registry.getService("offload.v1.Ed25519Service");
    assert.ok(service, "the service is in the returned files");
    const methods = {};
    for (const m of service.methods) {
      methods[m.name] = {
        path: `/${service.typeName}/${m.name}`,
        requestStream: false,
        responseStream: false,
        requestSerialize: (msg) => Buffer.from(toBinary(m.input, msg)),
        requestDeserialize: (b) => fromBinary(m.input, b),
        responseSerialize: (msg) => Buffer.from(toBinary(m.output, msg)),
        responseDeserialize: (b) => fromBinary(m.output, b),
      };
    }
    assert.deepEqual(Object.keys(methods).sort(), ["BatchSign", "BatchVerify", "Sign", "Verify"]);
    const Generic = grpc.makeGenericClientConstructor(methods, "Ed25519Service");
    const generic = new Generic(target(server.grpc), grpc.credentials.createInsecure(), channelOptions);
    try {
      const verify = service.methods.find((m) => m.name === "Verify");
      const message = Buffer.from("reflected");
      const { signature } = await unary(c.ed25519, "Sign", { key_id: "signer", message });
      const good = await unary(generic, "Verify", create(verify.input, { publicKey, message, signature }));
      assert.equal(good.$typeName, "offload.v1.VerifyResponse");
      assert.equal(good.valid, true);
      const bad = await unary(generic, "Verify", create(verify.input, { publicKey, message: Buffer.from("other"), signature }));
      assert.equal(bad.valid, false);
      // The batch type, with its nested messages from common.proto.
      const batchVerify = service.methods.find((m) => m.name === "BatchVerify");
      const batch = await unary(
        generic,
        "BatchVerify",
        create(batchVerify.input, {
          items: [
            { publicKey, message, signature },
            { publicKey: Buffer.alloc(31), message, signature },
          ],
        }),
      );
      assert.equal(batch.results.length, 2);
      assert.equal(batch.results[0].valid, true);
      assert.equal(batch.results[1].status.code, Status.INVALID_ARGUMENT);
      assert.match(batch.results[1].status.message, /public_key/);
    } finally {
      generic.close();
    }
  });
});

describe("grpc-js: a health Watch across a drain", () => {
  it("SERVING, then SIGTERM: NOT_SERVING streamed, the stream ends UNAVAILABLE, the server exits 0", async () => {
    const server = await startEngineServer();
    const c = clients(target(server.grpc));
    try {
      const watch = c.health.Watch({ service: "" }, { deadline: deadline() });
      const statuses = [];
      let onStatus;
      watch.on("data", (m) => {
        statuses.push(m.status);
        onStatus?.();
      });
      const ended = new Promise((resolve) => {
        watch.on("error", resolve);
        watch.on("end", () => resolve(null));
      });
      await new Promise((resolve) => {
        onStatus = resolve;
        if (statuses.length) resolve();
      });
      assert.deepEqual(statuses, ["SERVING"]);
      const stopped = server.stop();
      const error = await ended;
      assert.deepEqual(statuses, ["SERVING", "NOT_SERVING"]);
      assert.ok(error, "the stream ends with an error status");
      assert.equal(error.code, Status.UNAVAILABLE, `${error.code} ${error.details}`);
      // The server's own status in the stream's trailers, not a connection that went away.
      assert.match(error.details, /draining/);
      const { code } = await stopped;
      assert.equal(code, 0);
      const last = server.log().trim().split("\n").pop();
      assert.match(last, /"event":"server_stopped"/);
    } finally {
      c.close();
      if (server.alive()) await server.stop();
    }
  });
});
