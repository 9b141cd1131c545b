// The TypeScript client against a real offload_server on loopback (node:test). Counts are read
// at the server (/metrics, offload_requests_total) as well as from the client's stats().
//   OFFLOAD_SERVER  the offload_server binary (default ../../../build/bin/offload_server)
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { connect, createServer as createNetServer } from "node:net";

import { Code, ConnectError, createOffloadClient, KeyType, kMiB } from "../dist/node.js";
import { createFetchTransport, createNodeTransport, nodeCrypto } from "../dist/node.js";
import { kByteArrayOverheadBytes, kEntryOverheadBytes } from "../dist/memo.js";
import {
  adminClient,
  assertCountsSince,
  makeBlobs,
  manualClock,
  newKey,
  requestCounts,
  startServer,
  tokenIssuer,
} from "./helpers.mjs";

let server;
let admin;

before(async () => {
  server = await startServer([]);
  admin = adminClient(server);
});

after(async () => {
  if (!server) return;
  const { code, signal } = await server.stop();
  assert.equal(signal, null, server.log());
  assert.equal(code, 0, server.log());
});

// The transports a phone or a page would use, from Node: fetch (Connect, HTTP/1.1) and Node's
// HTTP/2 (gRPC-Web).
const transports = {
  "Connect over fetch": (s) => createFetchTransport({ baseUrl: s.http, protocol: "connect" }),
  "gRPC-Web over HTTP/2": (s) => createNodeTransport({ baseUrl: s.http, protocol: "grpc-web", httpVersion: "2" }),
};

const equalBytes = (a, b) => Buffer.from(a).equals(Buffer.from(b));

describe("the mobile resume: 27 blobs of 54-56 KB read twice", () => {
  for (const [name, make] of Object.entries(transports)) {
    it(`${name}: one BatchOpen the first time, no request the second`, async () => {
      const keyId = await newKey(admin, "resume");
      const blobs = await makeBlobs(admin, keyId, 27);
      const phone = createOffloadClient({ transport: make(server), memo: { open: { maxAgeMs: 60_000 } } });
      const replay = () => Promise.all(blobs.map((b) => phone.open(b)));

      let before = await requestCounts(server);
      const first = await replay();
      blobs.forEach((b, i) => {
        assert.ok(equalBytes(first[i].plaintext, b.plaintext), `blob ${i}`);
        assert.equal(first[i].local, false);
      });
      await assertCountsSince(server, before, { "AeadService/BatchOpen OK": 1 }, "first resume");

      before = await requestCounts(server);
      const second = await replay();
      blobs.forEach((b, i) => {
        assert.ok(equalBytes(second[i].plaintext, b.plaintext), `blob ${i} again`);
        assert.equal(second[i].local, true);
      });
      await assertCountsSince(server, before, {}, "second resume");

      const s = phone.stats();
      assert.equal(s.requests, 1);
      assert.equal(s.batches, 1);
      assert.equal(s.batchedItems, 27);
      assert.equal(s.memos.open.hits, 27);
      assert.equal(s.memos.open.misses, 27);
      assert.equal(s.memos.open.entries, 27);
      const up = blobs.reduce((n, b) => n + b.keyId.length + b.envelope.length + b.associatedData.length, 0);
      const down = blobs.reduce((n, b) => n + b.plaintext.length, 0);
      assert.equal(s.memos.open.bytesNotSent, up);
      assert.equal(s.memos.open.bytesNotReceived, down);
      assert.ok(down > 27 * 54000 && s.memos.open.bytes <= 8 * kMiB);
    });
  }

  it("without batching: 27 Opens the first time, none the second", async () => {
    const keyId = await newKey(admin, "resume-single");
    const blobs = await makeBlobs(admin, keyId, 27, 1);
    const phone = createOffloadClient({
      transport: transports["Connect over fetch"](server),
      batching: false,
      memo: { open: { maxAgeMs: 60_000 } },
    });
    let before = await requestCounts(server);
    for (const b of blobs) assert.ok(equalBytes((await phone.open(b)).plaintext, b.plaintext));
    await assertCountsSince(server, before, { "AeadService/Open OK": 27 }, "first resume");
    before = await requestCounts(server);
    for (const b of blobs) assert.equal((await phone.open(b)).local, true);
    await assertCountsSince(server, before, {}, "second resume");
    assert.equal(phone.stats().requests, 27);
  });

  it("Seal records the envelope it produced: opening it sends nothing", async () => {
    const keyId = await newKey(admin, "echo");
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), memo: { open: { maxAgeMs: 60_000 } } });
    const plaintext = Buffer.from("read state");
    const associatedData = Buffer.from("user-42");
    const before = await requestCounts(server);
    const { envelope } = await phone.seal({ keyId, plaintext, associatedData });
    const opened = await phone.open({ keyId, envelope, associatedData });
    assert.ok(equalBytes(opened.plaintext, plaintext));
    assert.equal(opened.local, true);
    // Another associated data is another entry: asked, and refused by the server.
    await assert.rejects(phone.open({ keyId, envelope, associatedData: Buffer.from("user-43") }), (e) => e.code === Code.InvalidArgument);
    await assertCountsSince(server, before, { "AeadService/Seal OK": 1, "AeadService/Open INVALID_ARGUMENT": 1 }, "seal, open");
  });
});

// Node callers pass Buffers, whose slice() is a view, not a copy. The README tells callers to
// wipe their plaintexts: that must never wipe what the memo keeps.
describe("a caller that wipes its Buffers", () => {
  it("seal's plaintext and open's result: the memo keeps copies of its own", async () => {
    const keyId = await newKey(admin, "wiping-caller");
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), memo: { open: { maxAgeMs: 60_000 } } });
    const plaintext = Buffer.from("read state");
    const { envelope } = await phone.seal({ keyId, plaintext });
    plaintext.fill(0); // done with it
    const first = await phone.open({ keyId, envelope });
    assert.equal(first.local, true);
    assert.equal(Buffer.from(first.plaintext).toString(), "read state", "the memo's copy was the caller's buffer");
    first.plaintext.fill(0);
    const again = await phone.open({ keyId, envelope });
    assert.equal(Buffer.from(again.plaintext).toString(), "read state", "a hit's copy was the memo's own");
  });

  it("derive: wiping a shared key given to the caller leaves the remembered one", async () => {
    const keyId = await newKey(admin, "wiping-dh", KeyType.X25519);
    const { generateKeyPairSync } = await import("node:crypto");
    const peer = Buffer.from(generateKeyPairSync("x25519").publicKey.export({ format: "jwk" }).x, "base64url");
    const device = createOffloadClient({ transport: transports["gRPC-Web over HTTP/2"](server), memo: { derive: { maxAgeMs: 60_000 } } });
    const a = await device.derive({ keyId, peerPublicKey: peer });
    const truth = Buffer.from(a.sharedKey);
    a.sharedKey.fill(0);
    const b = await device.derive({ keyId, peerPublicKey: peer });
    assert.equal(b.local, true);
    assert.ok(equalBytes(b.sharedKey, truth));
    b.sharedKey.fill(0);
    assert.ok(equalBytes((await device.derive({ keyId, peerPublicKey: peer })).sharedKey, truth));
  });
});

// A caller that reuses its buffers while a call is under way (the next blob read into the same
// buffer) must not make the memo remember one input's answer under another input: the client
// reads the inputs once, when called.
describe("a caller's buffer changed while its call is under way", () => {
  it("open: the memo never answers an envelope with another envelope's plaintext", async () => {
    const keyId = await newKey(admin, "reused-open");
    const associatedData = Buffer.from("user-42/read-state");
    const [p1, p2] = [Buffer.from("read state one"), Buffer.from("read state two")];
    const e1 = (await admin.seal({ keyId, plaintext: p1, associatedData })).envelope;
    const e2 = (await admin.seal({ keyId, plaintext: p2, associatedData })).envelope;
    assert.equal(e1.length, e2.length);
    const buffer = Buffer.from(e1);
    let reuse = false;
    // The caller's next read lands in `buffer` while the client digests this call's input.
    const crypto = {
      sha256: async (d) => {
        const h = await nodeCrypto.sha256(d);
        if (reuse) {
          reuse = false;
          buffer.set(e2);
        }
        return h;
      },
      randomBytes: nodeCrypto.randomBytes,
    };
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), crypto, memo: { open: { maxAgeMs: 60_000 } } });
    reuse = true;
    const first = await phone.open({ keyId, envelope: buffer, associatedData });
    assert.ok(equalBytes(first.plaintext, p1), "the call opened the envelope it was given");
    const again = await phone.open({ keyId, envelope: Buffer.from(e1), associatedData });
    assert.ok(equalBytes(again.plaintext, p1), `envelope one answered with "${Buffer.from(again.plaintext)}"`);
  });

  it("seal: the envelope is remembered with the plaintext that was sealed", async () => {
    const keyId = await newKey(admin, "reused-seal");
    const real = transports["Connect over fetch"](server);
    const plaintext = Buffer.from("read state one");
    let reuse = false;
    // The caller's next plaintext lands in its buffer while the answer is on its way.
    const transport = {
      unary: async (...args) => {
        const r = await real.unary(...args);
        if (reuse) {
          reuse = false;
          plaintext.set(Buffer.from("READ STATE TWO"));
        }
        return r;
      },
      stream: (...args) => real.stream(...args),
    };
    const phone = createOffloadClient({ transport, memo: { open: { maxAgeMs: 60_000 } } });
    reuse = true;
    const { envelope } = await phone.seal({ keyId, plaintext });
    const opened = await phone.open({ keyId, envelope });
    const truth = await admin.open({ keyId, envelope });
    assert.equal(Buffer.from(truth.plaintext).toString(), "read state one");
    assert.equal(Buffer.from(opened.plaintext).toString(), "read state one", "the memo's answer differs from the server's");
  });
});

describe("least recently used by bytes", () => {
  it("live blobs re-read between new ones stay, where an oldest-first memo would evict them", async () => {
    const keyId = await newKey(admin, "lru");
    const live = await makeBlobs(admin, keyId, 3, 2);
    const fresh = await makeBlobs(admin, keyId, 20, 3);
    // Room for about 8 blobs: less than the 23 of the set.
    const maxBytes = 8 * 56_200;
    const phone = createOffloadClient({
      transport: transports["gRPC-Web over HTTP/2"](server),
      batching: false,
      memo: { open: { maxAgeMs: 60_000, maxBytes } },
    });
    // The same trace through a memo that evicts the oldest insert first (FIFO), as a model:
    // it must lose the live blobs, or this trace proves nothing.
    const fifo = { order: [], bytes: 0, misses: 0 };
    const fifoRead = (b) => {
      if (fifo.order.includes(b)) return;
      fifo.misses++;
      fifo.order.push(b);
      fifo.bytes += b.plaintext.length + kEntryOverheadBytes + kByteArrayOverheadBytes + b.keyId.length;
      while (fifo.bytes > maxBytes) {
        const old = fifo.order.shift();
        fifo.bytes -= old.plaintext.length + kEntryOverheadBytes + kByteArrayOverheadBytes + old.keyId.length;
      }
    };
    const before = await requestCounts(server);
    const read = async (b) => {
      fifoRead(b);
      const r = await phone.open(b);
      assert.ok(equalBytes(r.plaintext, b.plaintext));
      return r;
    };
    for (const b of live) assert.equal((await read(b)).local, false);
    for (const b of fresh) {
      assert.equal((await read(b)).local, false);
      for (const l of live) assert.equal((await read(l)).local, true, "a live blob was evicted");
    }
    await assertCountsSince(server, before, { "AeadService/Open OK": 23 }, "23 distinct blobs, each opened once");
    assert.ok(fifo.misses > 23, `an oldest-first memo would have missed ${fifo.misses - 23} live reads`);
    const s = phone.stats().memos.open;
    assert.equal(s.hits, 60);
    assert.ok(s.bytes <= maxBytes && s.entries < 23, `${s.entries} entries, ${s.bytes} bytes`);
    assert.equal(s.evictions, 23 - s.entries);
  });
});

// The memo's byte bound is a bound on the memory it holds: what a full memo gives back to the
// JavaScript heap when it is cleared, measured after collecting garbage, is about its budget (V8
// here; other engines differ a little), not a multiple of it. 2000 distinct derives and verifies
// into budgets that hold a few hundred of each.
describe("a full memo's memory", () => {
  it("derive and verify: clearing full memos frees about their byte budgets", async () => {
    const { setFlagsFromString } = await import("node:v8");
    const { runInNewContext } = await import("node:vm");
    const { randomBytes } = await import("node:crypto");
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc");
    const heap = () => {
      for (let i = 0; i < 4; i++) gc();
      const m = process.memoryUsage();
      return m.heapUsed + m.arrayBuffers;
    };
    const budget = 128 * 1024;
    const n = 2000;
    const keyId = await newKey(admin, "heap-dh", KeyType.X25519);
    const signer = await newKey(admin, "heap-signer", KeyType.ED25519);
    const peers = Array.from({ length: n }, () => randomBytes(32));
    const messages = Array.from({ length: n }, (_, i) => Buffer.from(`message ${i}`));
    const signed = [];
    for (let i = 0; i < n; i += 1000) {
      const items = messages.slice(i, i + 1000).map((message) => ({ keyId: signer, message }));
      signed.push(...(await admin.services.ed25519.batchSign({ items })).results.map((r) => r.response));
    }
    const device = createOffloadClient({
      transport: transports["Connect over fetch"](server),
      memo: { derive: { maxAgeMs: 600_000, maxBytes: budget }, verify: { maxBytes: budget } },
    });
    let derived = await Promise.all(peers.map((peerPublicKey) => device.derive({ keyId, peerPublicKey })));
    let verified = await Promise.all(
      messages.map((message, i) => device.verify({ publicKey: signed[i].publicKey, message, signature: signed[i].signature })),
    );
    assert.ok(verified.every((v) => v.valid) && derived.every((d) => d.sharedKey.length === 32));
    derived = verified = undefined; // the callers' copies: only the memos hold anything now
    const s = device.stats().memos;
    assert.ok(s.derive.evictions > 0 && s.verify.evictions > 0, "the memos were filled");
    assert.ok(s.derive.bytes <= budget && s.verify.bytes <= budget);
    // Collect until what earlier calls left (and their finalizers) is gone: a steady heap.
    let full = heap();
    for (let i = 0; i < 20; i++) {
      await new Promise((r) => setTimeout(r, 50));
      const again = heap();
      const steady = Math.abs(again - full) < 4096;
      full = again;
      if (steady) break;
    }
    device.clearMemos();
    const held = full - heap();
    assert.ok(held <= 1.25 * 2 * budget, `two memos of ${budget} bytes each (${s.derive.entries} + ${s.verify.entries} entries) held ${held} bytes`);
  });
});

describe("a tampered envelope", () => {
  it("fails every time, is never cached, and costs the key's other entries nothing", async () => {
    const keyId = await newKey(admin, "tamper");
    const [good, other] = await makeBlobs(admin, keyId, 2, 4);
    const bad = { ...good, envelope: Buffer.from(good.envelope) };
    bad.envelope[bad.envelope.length - 1] ^= 1;
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), memo: { open: { maxAgeMs: 60_000 } } });
    await phone.open(good);
    const before = await requestCounts(server);
    for (let i = 0; i < 3; i++) {
      await assert.rejects(phone.open(bad), (e) => e instanceof ConnectError && e.code === Code.InvalidArgument && /authentication failed/.test(e.message));
    }
    // In a batch too: only its own caller fails.
    const r = await Promise.allSettled([phone.open(bad), phone.open(other), phone.open(good)]);
    assert.equal(r[0].status, "rejected");
    assert.equal(r[0].reason.code, Code.InvalidArgument);
    assert.equal(r[1].status, "fulfilled");
    assert.equal(r[2].value.local, true, "the good envelope stays remembered");
    await assertCountsSince(server, before, { "AeadService/Open INVALID_ARGUMENT": 3, "AeadService/BatchOpen OK": 1 }, "tampered");
    const s = phone.stats().memos.open;
    assert.equal(s.entries, 2);
    assert.equal(s.droppedForKey, 0);
  });
});

describe("a disabled key", () => {
  it("loses its entries on the first refusal", async () => {
    const keyId = await newKey(admin, "disabled");
    const otherKey = await newKey(admin, "still-enabled");
    const blobs = await makeBlobs(admin, keyId, 5, 5);
    const [kept] = await makeBlobs(admin, otherKey, 1, 6);
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), memo: { open: { maxAgeMs: 60_000 } } });
    await Promise.all([...blobs.slice(0, 4), kept].map((b) => phone.open(b)));
    assert.equal(phone.stats().memos.open.entries, 5);
    await admin.services.keys.disableKey({ keyId }); // the phone does not see this
    const before = await requestCounts(server);
    // Within the maximum age, remembered results are still used (no request)...
    assert.equal((await phone.open(blobs[0])).local, true);
    // ... until the server refuses the key: then all of its entries go at once.
    await assert.rejects(phone.open(blobs[4]), (e) => e.code === Code.FailedPrecondition);
    const s = phone.stats().memos.open;
    assert.equal(s.droppedForKey, 4);
    assert.equal(s.entries, 1, "the other key's entry stays");
    for (const b of blobs.slice(0, 4)) await assert.rejects(phone.open(b), (e) => e.code === Code.FailedPrecondition);
    assert.equal((await phone.open(kept)).local, true);
    await assertCountsSince(server, before, { "AeadService/Open FAILED_PRECONDITION": 5 }, "after the refusal");
    // Enabled again: asked afresh, remembered again.
    await admin.services.keys.enableKey({ keyId });
    assert.equal((await phone.open(blobs[0])).local, false);
    assert.equal((await phone.open(blobs[0])).local, true);
  });

  it("loses its entries after the maximum age, refusal seen or not", async () => {
    const keyId = await newKey(admin, "aged");
    const blobs = await makeBlobs(admin, keyId, 3, 7);
    const clock = manualClock();
    const phone = createOffloadClient({
      transport: transports["gRPC-Web over HTTP/2"](server),
      now: clock.now,
      memo: { open: { maxAgeMs: 30_000 } },
    });
    await Promise.all(blobs.map((b) => phone.open(b)));
    await admin.services.keys.disableKey({ keyId });
    clock.advance(29_000);
    let before = await requestCounts(server);
    for (const b of blobs) assert.equal((await phone.open(b)).local, true, "within the maximum age");
    await assertCountsSince(server, before, {}, "within the maximum age");
    clock.advance(2_000); // 31 s after they were kept: never used again
    before = await requestCounts(server);
    const r = await Promise.allSettled(blobs.map((b) => phone.open(b)));
    for (const x of r) assert.equal(x.reason?.code, Code.FailedPrecondition);
    await assertCountsSince(server, before, { "AeadService/BatchOpen OK": 1 }, "past the maximum age");
    const s = phone.stats().memos.open;
    assert.equal(s.expired, 3);
    assert.equal(s.entries, 0);
  });

  it("a phone that slept: the monotonic clock stood still, the wall clock did not", async () => {
    const keyId = await newKey(admin, "slept");
    const blobs = await makeBlobs(admin, keyId, 2, 12);
    const monotonic = manualClock(); // performance.now does not count the sleep
    const wall = manualClock(1_700_000_000_000);
    const phone = createOffloadClient({ baseUrl: server.http, now: monotonic.now, wallNow: wall.now, memo: { open: { maxAgeMs: 30_000 } } });
    await Promise.all(blobs.map((b) => phone.open(b)));
    await admin.services.keys.disableKey({ keyId });
    wall.advance(29_000);
    assert.equal((await phone.open(blobs[0])).local, true, "within the maximum age on both clocks");
    wall.advance(2_000); // 31 s of sleep: never used again
    const before = await requestCounts(server);
    await assert.rejects(phone.open(blobs[0]), (e) => e.code === Code.FailedPrecondition);
    await assertCountsSince(server, before, { "AeadService/Open FAILED_PRECONDITION": 1 }, "after the sleep");
    assert.equal(phone.stats().memos.open.expired, 2);
  });
});

describe("auto-batching", () => {
  it("27 concurrent Opens go as one BatchOpen; each caller gets its own result or error", async () => {
    const keyId = await newKey(admin, "batch");
    const blobs = await makeBlobs(admin, keyId, 27, 8);
    const bad = { ...blobs[13], envelope: Buffer.from(blobs[13].envelope) };
    bad.envelope[40] ^= 0x80;
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), memo: { verify: false } });
    const before = await requestCounts(server);
    const calls = blobs.map((b, i) => (i === 13 ? phone.open(bad) : phone.open(b)));
    const r = await Promise.allSettled(calls);
    r.forEach((x, i) => {
      if (i === 13) {
        assert.equal(x.status, "rejected");
        assert.equal(x.reason.code, Code.InvalidArgument);
      } else {
        assert.equal(x.status, "fulfilled", `${i}: ${x.reason}`);
        assert.ok(equalBytes(x.value.plaintext, blobs[i].plaintext), `blob ${i}`);
        assert.equal(x.value.memoHit, true, "Seal recorded it at the server");
      }
    });
    await assertCountsSince(server, before, { "AeadService/BatchOpen OK": 1 }, "27 opens");
    assert.deepEqual([phone.stats().requests, phone.stats().batches, phone.stats().batchedItems], [1, 1, 27]);
  });

  it("each caller of a batch gets copies of its own (binary and JSON); the answer's secrets are zero-filled", async () => {
    const keyId = await newKey(admin, "copies");
    const blobs = await makeBlobs(admin, keyId, 2, 13);
    const dh = await newKey(admin, "copies-dh", KeyType.X25519);
    const { generateKeyPairSync } = await import("node:crypto");
    const peers = [1, 2].map(() => Buffer.from(generateKeyPairSync("x25519").publicKey.export({ format: "jwk" }).x, "base64url"));
    const own = (b) => b.byteOffset === 0 && b.buffer.byteLength === b.length;
    for (const binary of [true, false]) {
      const answers = []; // what the transport decoded, as the client got it
      const fetchTransport = createFetchTransport({ baseUrl: server.http, binary });
      const transport = { ...fetchTransport, unary: async (...a) => { const res = await fetchTransport.unary(...a); answers.push(res.message); return res; } };
      const phone = createOffloadClient({ transport, memo: { verify: false } });
      const [r1, r2] = await Promise.all(blobs.map((b) => phone.open(b)));
      const [d1, d2] = await Promise.all(peers.map((peerPublicKey) => phone.derive({ keyId: dh, peerPublicKey })));
      assert.equal(phone.stats().batches, 2, "one BatchOpen, one BatchDerive");
      assert.ok(equalBytes(r1.plaintext, blobs[0].plaintext) && equalBytes(r2.plaintext, blobs[1].plaintext));
      assert.ok(own(r1.plaintext) && own(r2.plaintext) && own(d1.sharedKey) && own(d2.sharedKey), "a buffer of its own each");
      assert.ok(!Buffer.from(r2.plaintext.buffer).includes(Buffer.from(blobs[0].plaintext).subarray(0, 32)), "no byte of the other's plaintext");
      const d2Key = Buffer.from(d2.sharedKey);
      r1.plaintext.fill(0);
      d1.sharedKey.fill(0);
      assert.ok(equalBytes(r2.plaintext, blobs[1].plaintext) && equalBytes(d2.sharedKey, d2Key), "the other caller's copy is intact");
      for (const [answer, field] of [[answers[0], "plaintext"], [answers[1], "sharedKey"]]) {
        assert.equal(answer.results.length, 2);
        for (const it of answer.results) assert.ok(it.response[field].length > 0 && it.response[field].every((x) => x === 0), `${field} of the answer zero-filled`);
      }
    }
  });

  it("chunks at maxItems, and batches each kind apart", async () => {
    const keyId = await newKey(admin, "chunks");
    const blobs = await makeBlobs(admin, keyId, 25, 9);
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](server), batching: { maxItems: 10 } });
    const before = await requestCounts(server);
    const sealed = await Promise.all([
      ...blobs.map((b) => phone.open(b)),
      phone.seal({ keyId, plaintext: Buffer.from("one") }),
      phone.seal({ keyId, plaintext: Buffer.from("two") }),
    ]);
    assert.equal(sealed.length, 27);
    await assertCountsSince(server, before, { "AeadService/BatchOpen OK": 3, "AeadService/BatchSeal OK": 1 }, "chunks");
  });
});

describe("tokens", () => {
  let authServer;
  let issuer;
  before(async () => {
    // bob may use keys named bob-* only: a call of his on another key is refused.
    issuer = tokenIssuer("ts-client", {
      admins: ["ts-client"],
      grants: [{ client: "ts-client", keys: ["*"], operations: ["*"] }, { client: "bob", keys: ["bob-*"], operations: ["aead.*"] }],
    });
    authServer = await startServer(issuer.flags);
  });
  after(async () => {
    if (authServer) assert.equal((await authServer.stop()).code, 0);
    issuer?.cleanup();
  });

  it("UNAUTHENTICATED asks the provider once more, and the calls go on with the new token", async () => {
    const asked = [];
    const tokenProvider = ({ refresh }) => {
      asked.push(refresh);
      return issuer.token({ expired: asked.length === 1 }); // the first one has expired
    };
    const setup = createOffloadClient({ baseUrl: authServer.http, tokenProvider: () => issuer.token() });
    const keyId = await newKey(setup, "tokens");
    const blobs = await makeBlobs(setup, keyId, 27, 10);
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](authServer), tokenProvider, memo: { open: { maxAgeMs: 60_000 } } });
    const before = await requestCounts(authServer);
    const opened = await Promise.all(blobs.map((b) => phone.open(b)));
    opened.forEach((o, i) => assert.ok(equalBytes(o.plaintext, blobs[i].plaintext)));
    assert.deepEqual(asked, [false, true]);
    await assertCountsSince(authServer, before, { "AeadService/BatchOpen UNAUTHENTICATED": 1, "AeadService/BatchOpen OK": 1 }, "refresh");
    // Later calls use the new token: no more asking.
    await phone.seal({ keyId, plaintext: Buffer.from("x") });
    assert.deepEqual(asked, [false, true]);
    assert.equal(phone.stats().tokenRefreshes, 1);
  });

  it("per-call tokens: calls are batched only with calls of the same headers, each under its own identity", async () => {
    const setup = createOffloadClient({ baseUrl: authServer.http, tokenProvider: () => issuer.token() });
    const keyId = await newKey(setup, "not-bobs");
    const { envelope } = await setup.seal({ keyId, plaintext: Buffer.from("for the granted only") });
    const phone = createOffloadClient({ transport: transports["Connect over fetch"](authServer), memo: { open: { maxAgeMs: 60_000 } } });
    const alice = { headers: { authorization: `Bearer ${issuer.token()}` } };
    const bob = { headers: new Headers({ Authorization: `Bearer ${issuer.token({ sub: "bob" })}` }) };
    const outcome = (x) => (x.status === "fulfilled" ? "ok" : Code[x.reason.code]);
    let before = await requestCounts(authServer);
    const sealed = await Promise.allSettled([
      phone.seal({ keyId, plaintext: Buffer.from("a1") }, alice),
      phone.seal({ keyId, plaintext: Buffer.from("b1") }, bob),
      phone.seal({ keyId, plaintext: Buffer.from("a2") }, { headers: { Authorization: alice.headers.authorization } }),
      phone.seal({ keyId, plaintext: Buffer.from("b2") }, bob),
    ]);
    assert.deepEqual(sealed.map(outcome), ["ok", "PermissionDenied", "ok", "PermissionDenied"]);
    await assertCountsSince(authServer, before, { "AeadService/BatchSeal OK": 1, "AeadService/BatchSeal PERMISSION_DENIED": 1 }, "one batch per identity");
    // The same envelope opened by both in one tick: not asked once for the two of them.
    before = await requestCounts(authServer);
    const opened = await Promise.allSettled([phone.open({ keyId, envelope }, alice), phone.open({ keyId, envelope }, bob)]);
    assert.deepEqual(opened.map(outcome), ["ok", "PermissionDenied"]);
    await assertCountsSince(authServer, before, { "AeadService/Open OK": 1, "AeadService/Open PERMISSION_DENIED": 1 }, "one open per identity");
    // Later ticks. Bob's refusal dropped the key's entries (PERMISSION_DENIED does): alice's
    // open is fetched again and remembered, then answered locally. Bob's is not answered from
    // what alice's call fetched (entries are kept per set of per-call headers): the server
    // refuses it again.
    before = await requestCounts(authServer);
    await phone.open({ keyId, envelope }, alice);
    const hit = await phone.open({ keyId, envelope }, alice);
    assert.equal(hit.local, true);
    await assert.rejects(phone.open({ keyId, envelope }, bob), (e) => e.code === Code.PermissionDenied);
    await assertCountsSince(authServer, before, { "AeadService/Open OK": 1, "AeadService/Open PERMISSION_DENIED": 1 }, "bob asks the server");
  });

  it("a refused fresh token is not asked for again: the call fails UNAUTHENTICATED", async () => {
    const asked = [];
    const phone = createOffloadClient({
      baseUrl: authServer.http,
      tokenProvider: ({ refresh }) => (asked.push(refresh), issuer.token({ expired: true })),
    });
    const before = await requestCounts(authServer);
    await assert.rejects(phone.services.keys.listKeys({}), (e) => e.code === Code.Unauthenticated);
    assert.deepEqual(asked, [false, true]);
    await assertCountsSince(authServer, before, { "KeyService/ListKeys UNAUTHENTICATED": 2 }, "refused twice");
  });
});

describe("typed calls of every RPC", () => {
  it("every unary method of every service is there, through the client's token and retries", async () => {
    const phone = createOffloadClient({ baseUrl: server.http });
    const names = Object.fromEntries(Object.entries(phone.services).map(([k, v]) => [k, Object.keys(v).sort()]));
    assert.deepEqual(names.aead, ["batchOpen", "batchRewrap", "batchSeal", "open", "rewrap", "seal"]);
    assert.deepEqual(names.box, ["batchOpen", "batchSeal", "open", "seal"]);
    assert.deepEqual(names.ed25519, ["batchSign", "batchVerify", "sign", "verify"]);
    assert.deepEqual(names.x25519, ["batchDerive", "derive"]);
    assert.ok(names.keys.includes("createKey") && names.keys.includes("setMinDecryptionVersion"), names.keys.join());
    const signer = await newKey(admin, "signer", KeyType.ED25519);
    const signed = await phone.sign({ keyId: signer, message: Buffer.from("hello") });
    const item = { publicKey: signed.publicKey, message: Buffer.from("hello"), signature: signed.signature };
    const before = await requestCounts(server);
    assert.equal((await phone.verify(item)).valid, true);
    assert.equal((await phone.verify(item)).local, true, "valid results are remembered");
    const badSig = { ...item, message: Buffer.from("hellO") };
    assert.equal((await phone.verify(badSig)).valid, false);
    assert.equal((await phone.verify(badSig)).valid, false, "invalid ones never");
    await assertCountsSince(server, before, { "Ed25519Service/Verify OK": 3 }, "verify memo");
    const info = await phone.services.keys.getKey({ keyId: signer });
    assert.equal(info.keyId, signer);
  });

  it("derive memo: a repeated peer costs no request; a rotation through the client drops it", async () => {
    const keyId = await newKey(admin, "dh", KeyType.X25519);
    const { generateKeyPairSync } = await import("node:crypto");
    const peer = Buffer.from(generateKeyPairSync("x25519").publicKey.export({ format: "jwk" }).x, "base64url");
    const device = createOffloadClient({ baseUrl: server.http, memo: { derive: { maxAgeMs: 300_000 } } });
    const before = await requestCounts(server);
    const a = await device.derive({ keyId, peerPublicKey: peer });
    const b = await device.derive({ keyId, peerPublicKey: peer });
    assert.equal(b.local, true);
    assert.ok(equalBytes(a.sharedKey, b.sharedKey));
    await device.services.keys.rotateKey({ keyId });
    const c = await device.derive({ keyId, peerPublicKey: peer });
    assert.equal(c.local, false);
    assert.equal(c.keyVersion, 2);
    await assertCountsSince(server, before, { "X25519Service/Derive OK": 2, "KeyService/RotateKey OK": 1 }, "derive");
  });
});

describe("an invalid key version", () => {
  it("is refused INVALID_ARGUMENT naming key_version, never answered from the memo", async () => {
    const keyId = await newKey(admin, "versions", KeyType.X25519);
    const { generateKeyPairSync } = await import("node:crypto");
    const peer = Buffer.from(generateKeyPairSync("x25519").publicKey.export({ format: "jwk" }).x, "base64url");
    const device = createOffloadClient({ baseUrl: server.http, memo: { derive: { maxAgeMs: 300_000 } } });
    const v1 = await device.derive({ keyId, peerPublicKey: peer, keyVersion: 1 });
    assert.equal((await device.derive({ keyId, peerPublicKey: peer, keyVersion: 1 })).local, true);
    const before = await requestCounts(server);
    for (const keyVersion of [2 ** 32 + 1, 1.5, -1, NaN]) {
      await assert.rejects(device.derive({ keyId, peerPublicKey: peer, keyVersion }), (e) =>
        e instanceof ConnectError && e.code === Code.InvalidArgument && /key_version/.test(e.message), `derive ${keyVersion}`);
      await assert.rejects(device.boxOpen({ keyId, peerPublicKey: peer, nonce: new Uint8Array(24), ciphertext: new Uint8Array(32), keyVersion }), (e) =>
        e.code === Code.InvalidArgument && /key_version/.test(e.message), `boxOpen ${keyVersion}`);
    }
    assert.equal(device.stats().memos.derive.hits, 1, "only the valid repeat was a hit");
    assert.equal(device.stats().requests, 1);
    await assertCountsSince(server, before, {}, "nothing sent");
    assert.equal(v1.keyVersion, 1);
  });
});

describe("a platform without WebCrypto (React Native)", () => {
  it("the memos use the crypto functions given in the options", async () => {
    const keyId = await newKey(admin, "rn");
    const blobs = await makeBlobs(admin, keyId, 3, 11);
    const used = { sha256: 0, randomBytes: 0 };
    const crypto = {
      sha256: (d) => (used.sha256++, nodeCrypto.sha256(d)),
      randomBytes: (n) => (used.randomBytes++, nodeCrypto.randomBytes(n)),
    };
    const phone = createOffloadClient({ baseUrl: server.http, crypto, memo: { open: { maxAgeMs: 60_000 } } });
    await Promise.all(blobs.map((b) => phone.open(b)));
    const again = await Promise.all(blobs.map((b) => phone.open(b)));
    assert.ok(again.every((o) => o.local));
    assert.deepEqual(used, { sha256: 6, randomBytes: 1 }, "one digest per lookup, one salt per client");
  });
});

describe("a server that is not listening yet (restarting)", () => {
  it("fetch: the refused connection is UNAVAILABLE and retried; once it listens, the call succeeds", async () => {
    // Its address: a loopback port that forwards to the server once the first attempt failed.
    const sockets = new Set();
    const forwarder = createNetServer((c) => {
      const up = connect(server.httpPort, "127.0.0.1");
      sockets.add(c).add(up);
      c.pipe(up).pipe(c);
      c.on("error", () => up.destroy());
      up.on("error", () => c.destroy());
    });
    const port = await new Promise((res) => {
      const s = createNetServer().listen(0, "127.0.0.1", () => {
        const p = s.address().port;
        s.close(() => res(p));
      });
    });
    const attempts = [];
    const phone = createOffloadClient({
      baseUrl: `http://127.0.0.1:${port}`,
      fetch: async (input, init) => {
        try {
          const res = await fetch(input, init);
          attempts.push("answered");
          return res;
        } catch (e) {
          attempts.push("refused");
          await new Promise((r) => forwarder.listen(port, "127.0.0.1", r)); // the server is back
          throw e;
        }
      },
      retry: { maxAttempts: 3, initialBackoffMs: 10 },
      memo: { verify: false },
    });
    try {
      const keyId = await newKey(admin, "restart");
      const before = await requestCounts(server);
      const { envelope } = await phone.seal({ keyId, plaintext: Buffer.from("after the restart") });
      assert.ok(envelope.length > 0);
      assert.deepEqual(attempts, ["refused", "answered"]);
      assert.deepEqual([phone.stats().requests, phone.stats().retries], [2, 1]);
      await assertCountsSince(server, before, { "AeadService/Seal OK": 1 }, "one seal reached the server");
    } finally {
      await new Promise((r) => { forwarder.close(() => r()); for (const c of sockets) c.destroy(); });
    }
  });
});

describe("retries against a server sized to refuse", () => {
  let small;
  before(async () => {
    small = await startServer(["--max_client_inflight=1"]);
  });
  after(async () => {
    if (small) assert.equal((await small.stop()).code, 0, small.log());
  });

  // Four BatchSigns of 1024 items at once from a client allowed one call in flight: the server
  // refuses the ones that arrive while one runs (RESOURCE_EXHAUSTED, HTTP 429 on Connect), and
  // the client sends them again after a backoff (or the delay the server gives), until all four
  // are signed. Every refusal the server counted is a retry the client made.
  for (const [name, make] of Object.entries(transports)) {
    it(`${name}: every call is answered; each refusal was retried`, async () => {
      const smallAdmin = adminClient(small);
      const keyId = await newKey(smallAdmin, "busy", KeyType.ED25519);
      const phone = createOffloadClient({ transport: make(small), timeoutMs: 60_000, retry: { maxAttempts: 12, initialBackoffMs: 50 } });
      const items = Array.from({ length: 1024 }, (_, i) => ({ keyId, message: Buffer.from(`message ${i}`) }));
      const before = await requestCounts(small);
      const answers = await Promise.all([1, 2, 3, 4].map(() => phone.services.ed25519.batchSign({ items })));
      for (const a of answers) assert.equal(a.results.filter((r) => r.response?.signature.length === 64).length, 1024);
      const { retries, retriesAfterServerDelay, requests } = phone.stats();
      assert.ok(retries >= 1, "the server refused none: the test shows nothing");
      assert.equal(requests, 4 + retries);
      // Every refusal says when to come back (RetryInfo; Retry-After on Connect's 429), and the
      // client waited at least that long before each retry.
      assert.equal(retriesAfterServerDelay, retries, "each refusal carried a retry delay");
      await assertCountsSince(small, before, {
        "Ed25519Service/BatchSign OK": 4,
        "Ed25519Service/BatchSign RESOURCE_EXHAUSTED": retries,
      }, "refused and retried");
    });
  }
});
