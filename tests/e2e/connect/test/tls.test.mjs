// The HTTP gateway over TLS: ALPN offers h2 and http/1.1, and connect-node's Connect and gRPC-Web
// transports over HTTPS (HTTP/2 and HTTP/1.1), and its gRPC transport over TLS on the gRPC port,
// all give the same answers. The certificate is a throwaway one made with the openssl command.
//   OFFLOAD_SERVER  path of the offload_server binary (required)
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect as tlsConnect } from "node:tls";

import { createClient } from "@connectrpc/connect";
import {
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
} from "@connectrpc/connect-node";

import { AeadService } from "../gen/offload/v1/aead_pb.js";
import { Ed25519Service } from "../gen/offload/v1/ed25519_pb.js";
import { KeyService, KeyType } from "../gen/offload/v1/keys_pb.js";
import { startServer } from "./server.mjs";

let server;
let dir;
let ca;

function alpn(port, protocols) {
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ host: "127.0.0.1", port, ca, ALPNProtocols: protocols, servername: undefined }, () => {
      const chosen = socket.alpnProtocol;
      socket.end();
      resolve(chosen);
    });
    socket.on("error", reject);
  });
}

// GET /readyz over TLS with no ALPN offered: the raw response's first bytes.
function readyzWithoutAlpn(port) {
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ host: "127.0.0.1", port, ca }, () => {
      socket.write("GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    });
    let data = "";
    socket.setEncoding("latin1");
    socket.on("data", (chunk) => { data += chunk; });
    socket.on("end", () => resolve(data));
    socket.on("error", reject);
  });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "offload-tls-"));
  execFileSync("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "2",
    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
  ], { stdio: "ignore" });
  ca = readFileSync(join(dir, "cert.pem"));
  server = await startServer(
    [`--tls_cert_file=${join(dir, "cert.pem")}`, `--tls_key_file=${join(dir, "key.pem")}`],
    { scheme: "https", ca },
  );
});

after(async () => {
  if (server) {
    const { code, signal } = await server.stop();
    assert.equal(signal, null);
    assert.equal(code, 0, server.log());
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("HTTPS with ALPN", () => {
  it("offers h2 and http/1.1, and speaks HTTP/1.1 to a client without ALPN", async () => {
    assert.equal(await alpn(server.httpPort, ["h2", "http/1.1"]), "h2");
    assert.equal(await alpn(server.httpPort, ["http/1.1"]), "http/1.1");
    assert.equal(await alpn(server.httpPort, undefined), false);
    // ... and without ALPN the server speaks HTTP/1.1 on that connection.
    assert.match(await readyzWithoutAlpn(server.httpPort), /^HTTP\/1\.1 200 /);
  });

  it("every transport over TLS answers as gRPC over TLS does", async () => {
    const grpc = createGrpcTransport({ baseUrl: server.grpc, httpVersion: "2", nodeOptions: { ca } });
    const ref = {
      keys: createClient(KeyService, grpc),
      ed25519: createClient(Ed25519Service, grpc),
      aead: createClient(AeadService, grpc),
    };
    await ref.keys.createKey({ keyId: "tls-signer", type: KeyType.ED25519 });
    await ref.keys.createKey({ keyId: "tls-blobs", type: KeyType.XCHACHA20_POLY1305 });
    const message = randomBytes(64);
    const signed = await ref.ed25519.sign({ keyId: "tls-signer", message });
    const item = { publicKey: signed.publicKey, message, signature: signed.signature };
    const plaintext = randomBytes(55000);
    const sealed = await ref.aead.seal({ keyId: "tls-blobs", plaintext });
    for (const httpVersion of ["2", "1.1"]) {
      const base = { baseUrl: server.http, httpVersion, nodeOptions: { ca } };
      for (const [name, transport] of [
        ["connect", createConnectTransport({ ...base, useBinaryFormat: true })],
        ["connect+json+get", createConnectTransport({ ...base, useBinaryFormat: false, useHttpGet: true })],
        ["grpc-web", createGrpcWebTransport({ ...base, useBinaryFormat: true })],
      ]) {
        const what = `${name} over HTTP/${httpVersion}`;
        const ed25519 = createClient(Ed25519Service, transport);
        const aead = createClient(AeadService, transport);
        const keys = createClient(KeyService, transport);
        assert.equal((await ed25519.verify(item)).valid, true, what);
        assert.equal((await ed25519.verify({ ...item, message: Buffer.from("x") })).valid, false, what);
        const opened = await aead.open({ keyId: "tls-blobs", envelope: sealed.envelope });
        assert.deepEqual(Buffer.from(opened.plaintext), plaintext, what);
        assert.equal(opened.memoHit, true, `${what}: Seal recorded the envelope`);
        const info = await keys.getKey({ keyId: "tls-signer" });
        assert.deepEqual(Buffer.from(info.versions[0].publicKey), Buffer.from(signed.publicKey), what);
      }
    }
  });
});
