// The sample against a server, through the TypeScript client (client/ts): a derive remembered by
// the client, a seal whose envelope is remembered (its open sends nothing), a resume of 27 blobs
// read twice (one BatchOpen, then no request at all), and a tampered envelope in a tick of opens
// (only its caller fails).
//   OFFLOAD_HTTP=http://127.0.0.1:8080 OFFLOAD_PROTOCOL=connect|connect-json|grpc-web npm start
// In a browser or React Native, give the client a baseUrl (fetch) instead of a Node transport:
//   const client = createOffloadClient({ baseUrl: "https://offload.example.com", ... });
// (React Native also needs `crypto: { sha256, randomBytes }`: docs/mobile.md.)
import { Code, ConnectError, createOffloadClient, createNodeTransport, DeriveOutput, KeyType } from "@crypto-offload/client/node";
import { generateKeyPairSync, randomBytes } from "node:crypto";

const baseUrl = process.env.OFFLOAD_HTTP ?? "http://127.0.0.1:8080";
const protocol = process.env.OFFLOAD_PROTOCOL ?? "connect";
const transport = createNodeTransport({
  baseUrl,
  protocol: protocol === "grpc-web" ? "grpc-web" : "connect",
  binary: protocol !== "connect-json",
  httpVersion: "1.1",
});

// The app's client: the open memo keeps up to 8 MiB of plaintexts for at most 5 minutes, the
// derive memo box keys for 5 minutes; the verify memo is on by default.
const client = createOffloadClient({
  transport,
  memo: { open: { maxAgeMs: 5 * 60_000 }, derive: { maxAgeMs: 5 * 60_000 } },
});
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const suffix = randomBytes(4).toString("hex");

// Keys are usually provisioned for an app; the sample makes its own (an admin call).
const dh = `device-dh-${suffix}`;
const blobs = `blobs-${suffix}`;
await client.services.keys.createKey({ keyId: dh, type: KeyType.X25519 });
await client.services.keys.createKey({ keyId: blobs, type: KeyType.XCHACHA20_POLY1305 });

// A peer's X25519 public key (a phone's own key pair, in a real app).
const peer = Buffer.from(generateKeyPairSync("x25519").publicKey.export({ format: "jwk" }).x!, "base64url");
const first = await client.derive({ keyId: dh, peerPublicKey: peer, output: DeriveOutput.BOX_BEFORENM });
const again = await client.derive({ keyId: dh, peerPublicKey: peer, output: DeriveOutput.BOX_BEFORENM });
console.log(`derive: ${hex(first.sharedKey).slice(0, 16)}... sent ${!first.local}, then from the client's memo ${again.local}`);

const aad = new TextEncoder().encode("user-42");
const { envelope } = await client.seal({ keyId: blobs, plaintext: new TextEncoder().encode("read state"), associatedData: aad });
const opened = await client.open({ keyId: blobs, envelope, associatedData: aad });
console.log(`open: "${new TextDecoder().decode(opened.plaintext)}" from the client's memo ${opened.local} (Seal recorded it)`);

// A resume: 27 blobs of ~55 KB that another install of the app sealed, read twice.
const writer = createOffloadClient({ transport, memo: { verify: false } });
const stored = await Promise.all(
  Array.from({ length: 27 }, (_, i) => writer.seal({ keyId: blobs, plaintext: randomBytes(55_000), associatedData: aad })),
);
for (const pass of ["first", "second"]) {
  const before = client.stats().requests;
  const r = await Promise.all(stored.map((s) => client.open({ keyId: blobs, envelope: s.envelope, associatedData: aad })));
  console.log(`resume (${pass}): ${r.length} blobs, ${client.stats().requests - before} request(s), ${r.filter((x) => x.local).length} from the client's memo`);
}

const bad = envelope.slice();
bad[bad.length - 1] ^= 1;
const results = await Promise.allSettled([client.open({ keyId: blobs, envelope: bad, associatedData: aad }), client.open({ keyId: blobs, envelope, associatedData: aad })]);
console.log("tampered, then good:", results.map((r) => (r.status === "rejected" ? `error ${Code[(r.reason as ConnectError).code]}` : `"${new TextDecoder().decode(r.value.plaintext)}"`)).join(", "));

const s = client.stats();
console.log(`stats: ${s.requests} requests; open memo ${s.memos.open!.hits} hits, ${s.memos.open!.bytesNotSent} bytes not sent, ${s.memos.open!.bytesNotReceived} not received`);

for (const keyId of [dh, blobs]) await client.services.keys.deleteKey({ keyId });
