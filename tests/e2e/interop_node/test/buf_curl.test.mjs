// Interop with `buf curl` (the Go binary of npm's @bufbuild/buf, built on connect-go and its
// reflection client): by server reflection alone, it lists every offload.v1 method on the gRPC
// port (served by our engine), and calls one with --protocol grpc there,
// and with --protocol grpcweb and --protocol connect on the HTTP port. Reflection is a
// bidirectional stream, so cleartext HTTP/2 with prior knowledge wherever buf reflects.
//
// buf curl reflects with the protocol of the call (`--protocol`, default connect): a Connect or
// gRPC-Web call by reflection needs the server to answer reflection over that protocol too. A
// second pair of cases gets the schema by reflection over gRPC (buf curl calling
// ServerReflectionInfo), hands it to buf curl as a descriptor set (--schema), and makes the
// gRPC-Web and Connect calls over HTTP/1.1 and HTTP/2. Asserts answers and codes.
// Run: OFFLOAD_SERVER=... node --test test/buf_curl.test.mjs
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { generateKeyPairSync, sign as nodeSign } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";

import { protoMethods, startEngineServer } from "./common.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const BUF = join(here, "../node_modules/.bin/buf");

let server;
let cacheDir; // buf's cache, private to this run

// Runs `buf curl ARGS...`: { code, stdout, stderr } (a non-zero exit is an answer too).
// Cleartext HTTP/2 (prior knowledge) unless ARGS start with "--http1".
function bufCurl(...args) {
  const http1 = args[0] === "--http1";
  const argv = http1 ? ["curl", ...args.slice(1)] : ["curl", "--http2-prior-knowledge", ...args];
  return new Promise((resolve, reject) => {
    execFile(
      BUF,
      argv,
      { env: { ...process.env, BUF_CACHE_DIR: cacheDir }, timeout: 120000, maxBuffer: 16 << 20 },
      (err, stdout, stderr) => {
        if (err && typeof err.code !== "number") return reject(err); // not started, or killed
        resolve({ code: err ? err.code : 0, stdout, stderr });
      },
    );
  });
}

async function bufCurlJson(...args) {
  const r = await bufCurl(...args);
  assert.equal(r.code, 0, `buf curl ${args.join(" ")}: exit ${r.code}\n${r.stderr}`);
  return JSON.parse(r.stdout);
}

// A signature made here by node:crypto: the request of a Verify, in buf curl's JSON.
function signedByNode(text) {
  const { publicKey, privateKey } = generateKeyPairSync("ed25519");
  const message = Buffer.from(text);
  return {
    publicKey: Buffer.from(publicKey.export({ format: "jwk" }).x, "base64url").toString("base64"),
    message: message.toString("base64"),
    signature: nodeSign(null, message, privateKey).toString("base64"),
  };
}

// The FileDescriptorProtos that server reflection v1 returns for `symbols` (asked by buf curl
// over gRPC on `base`), as one FileDescriptorSet (imports before the files that import them):
// the bytes of a .binpb file buf reads as a schema.
async function reflectedDescriptorSet(base, symbols) {
  const files = new Map(); // name -> { proto (decoded), bytes }
  for (const symbol of symbols) {
    const answer = await bufCurlJson("--protocol", "grpc", "-d", JSON.stringify({ fileContainingSymbol: symbol }),
      `${base}/grpc.reflection.v1.ServerReflection/ServerReflectionInfo`);
    assert.ok(answer.fileDescriptorResponse, JSON.stringify(answer));
    for (const b64 of answer.fileDescriptorResponse.fileDescriptorProto) {
      const bytes = Buffer.from(b64, "base64");
      const proto = fromBinary(FileDescriptorProtoSchema, bytes);
      files.set(proto.name, { proto, bytes });
    }
  }
  const ordered = [];
  const visit = (name) => {
    const f = files.get(name);
    assert.ok(f, `reflection sent ${name}`);
    if (ordered.includes(f)) return;
    for (const dep of f.proto.dependency) visit(dep);
    ordered.push(f);
  };
  for (const name of files.keys()) visit(name);
  // FileDescriptorSet: field 1 (length-delimited) once per file.
  return Buffer.concat(ordered.flatMap(({ bytes }) => [Buffer.from([0x0a]), varint(bytes.length), bytes]));
}

function varint(n) {
  const out = [];
  for (; n >= 0x80; n >>>= 7) out.push((n & 0x7f) | 0x80);
  out.push(n);
  return Buffer.from(out);
}

// Verify (valid, then not), health Check and an INVALID_ARGUMENT, with buf curl `args` (the
// protocol, the schema, the HTTP version) on `base`.
async function verifyAndCheck(base, label, ...args) {
  const request = signedByNode(`buf curl: ${label}`);
  const verify = `${base}/offload.v1.Ed25519Service/Verify`;
  const good = await bufCurlJson(...args, "-d", JSON.stringify(request), verify);
  assert.equal(good.valid, true, JSON.stringify(good));
  // Another message: not valid (proto3 JSON leaves the false out).
  const other = { ...request, message: Buffer.from("something else").toString("base64") };
  const bad = await bufCurlJson(...args, "-d", JSON.stringify(other), verify);
  assert.equal(bad.valid ?? false, false, JSON.stringify(bad));

  const health = await bufCurlJson(...args, "-d", '{"service":"offload.v1.Ed25519Service"}',
    `${base}/grpc.health.v1.Health/Check`);
  assert.deepEqual(health, { status: "SERVING" });

  // An error: a short public key is INVALID_ARGUMENT naming the field.
  const short = { ...request, publicKey: Buffer.from("short").toString("base64") };
  const r = await bufCurl(...args, "-d", JSON.stringify(short), verify);
  assert.notEqual(r.code, 0);
  const error = JSON.parse(r.stderr);
  assert.equal(error.code, "invalid_argument", r.stderr);
  assert.match(error.message, /public_key/);
}

describe("buf curl against the engine", () => {
  before(async () => {
    cacheDir = mkdtempSync(join(tmpdir(), "offload-buf-cache-"));
    server = await startEngineServer();
  });

  after(async () => {
    if (server) {
      const { code } = await server.stop();
      assert.equal(code, 0, "the server exits 0 on SIGTERM");
    }
    if (cacheDir) rmSync(cacheDir, { recursive: true, force: true });
  });

  it("--list-methods by reflection on the gRPC port lists every method of every offload.v1 service", async () => {
    const want = protoMethods();
    assert.ok(want.length >= 20, `the .proto files define ${want.length} methods`);
    const r = await bufCurl("--protocol", "grpc", "--list-methods", server.grpc);
    assert.equal(r.code, 0, r.stderr);
    const listed = r.stdout.split("\n").map((l) => l.trim()).filter(Boolean);
    assert.deepEqual(listed.filter((m) => m.startsWith("offload.v1.")).sort(), want);
    // And the services beside them.
    assert.ok(listed.includes("grpc.health.v1.Health/Check"), listed.join("\n"));
    assert.ok(listed.includes("grpc.health.v1.Health/Watch"), listed.join("\n"));
  });

  it("--list-methods gives the same list on the HTTP port (reflection over gRPC)", async () => {
    const r = await bufCurl("--protocol", "grpc", "--list-methods", server.http);
    assert.equal(r.code, 0, r.stderr);
    const listed = r.stdout.split("\n").map((l) => l.trim()).filter((l) => l.startsWith("offload.v1."));
    assert.deepEqual(listed.sort(), protoMethods());
  });

  // buf curl reflects over the protocol of its call. With grpcweb and connect this fails on
  // today's server (reported, not worked around here): it serves reflection over gRPC only, and
  // its refusal of a gRPC-Web or Connect reflection stream only comes once the request body ends,
  // which a bidirectional client never does before an answer; the stream is reset by
  // --http_read_timeout (10 s) and buf finds no schema.
  const calls = [
    ["grpc", "grpc"],
    ["grpcweb", "http"],
    ["connect", "http"],
  ];
  for (const [protocol, port] of calls) {
    it(`Ed25519 Verify and health Check with --protocol ${protocol} on the ${port} port, schema by buf's own reflection`, async () => {
      const base = port === "grpc" ? server.grpc : server.http;
      await verifyAndCheck(base, protocol, "--protocol", protocol);
    });
  }

  for (const protocol of ["grpcweb", "connect"]) {
    it(`--protocol ${protocol} on the HTTP port over HTTP/1.1 and HTTP/2, schema from reflection over gRPC`, async () => {
      const schema = join(cacheDir, "reflected.binpb");
      writeFileSync(schema, await reflectedDescriptorSet(server.grpc, ["offload.v1.Ed25519Service", "grpc.health.v1.Health"]));
      await verifyAndCheck(server.http, `${protocol} h2`, "--protocol", protocol, "--schema", schema);
      await verifyAndCheck(server.http, `${protocol} h1`, "--http1", "--protocol", protocol, "--schema", schema);
    });
  }
});
