// Runs the sample against a server: derive with memo, seal, open with memo, batch open.
//   OFFLOAD_HTTP=http://127.0.0.1:8080 OFFLOAD_PROTOCOL=connect|connect-json|grpc-web npm start
// In a browser or React Native, take the transport from @connectrpc/connect-web instead:
//   import { createConnectTransport } from "@connectrpc/connect-web";
//   const transport = createConnectTransport({ baseUrl: "https://offload.example.com" });
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";

import { KeyType } from "./gen/offload/v1/keys_pb.js";
import { Offload } from "./offload.js";

const baseUrl = process.env.OFFLOAD_HTTP ?? "http://127.0.0.1:8080";
const protocol = process.env.OFFLOAD_PROTOCOL ?? "connect";
const transport =
  protocol === "grpc-web"
    ? createGrpcWebTransport({ baseUrl, httpVersion: "1.1" })
    : createConnectTransport({ baseUrl, httpVersion: "1.1", useBinaryFormat: protocol !== "connect-json" });

const offload = new Offload(transport);
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

await offload.ensureKey("device-dh", KeyType.X25519);
await offload.ensureKey("blobs", KeyType.XCHACHA20_POLY1305);

// A peer's X25519 public key (a phone's own key pair, in a real app).
const { generateKeyPairSync } = await import("node:crypto");
const peer = Buffer.from(generateKeyPairSync("x25519").publicKey.export({ format: "jwk" }).x!, "base64url");
const first = await offload.boxKey("device-dh", peer);
const again = await offload.boxKey("device-dh", peer);
console.log(`derive: ${hex(first.key).slice(0, 16)}... memo_hit ${first.memoHit} then ${again.memoHit}`);

const aad = new TextEncoder().encode("user-42");
const envelope = await offload.seal("blobs", new TextEncoder().encode("read state"), aad);
const opened = await offload.open("blobs", envelope, aad);
console.log(`open: "${new TextDecoder().decode(opened.plaintext)}" memo_hit ${opened.memoHit}`);

const bad = envelope.slice();
bad[bad.length - 1] ^= 1;
const results = await offload.openMany("blobs", [envelope, bad], aad);
console.log("batch open:", results.map((r) => ("error" in r ? `error ${r.error}` : `"${new TextDecoder().decode(r.plaintext)}" memo_hit ${r.memoHit}`)));
