// Unit-level tests of the client's parts that need no offload_server: the memo (recency, byte
// bound, age, wiping), the salted digests, and the retry loop against a loopback HTTP responder
// that refuses the way the server is to refuse (issue 32: RetryInfo in Connect error details and
// in gRPC-Web's grpc-status-details-bin, Retry-After on 429 / 503).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";

import { create, toBinary } from "@bufbuild/protobuf";
import { anyPack } from "@bufbuild/protobuf/wkt";

import { kEntryOverheadBytes, Memo } from "../dist/memo.js";
import { Digester } from "../dist/digest.js";
import { settlePending } from "../dist/client.js";
import { Code, ConnectError, createOffloadClient, RetryInfoSchema, StatusSchema, serverRetryDelayMs } from "../dist/node.js";
import { createFetchTransport, createNodeTransport, nodeCrypto } from "../dist/node.js";

function bytesMemo(maxBytes, { maxAgeMs, now = () => 0, wallNow } = {}) {
  return new Memo({ maxBytes, maxAgeMs, now, wallNow, size: (v) => v.length, wipe: (v) => v.fill(0) });
}
const overhead = kEntryOverheadBytes + 1; // and a one-letter key id

describe("Memo", () => {
  it("a hit moves the entry to the newest end; inserts evict the least recently used", () => {
    const m = bytesMemo(3 * (100 + overhead));
    const v = { a: new Uint8Array(100).fill(1), b: new Uint8Array(100).fill(2), c: new Uint8Array(100).fill(3), d: new Uint8Array(100).fill(4) };
    for (const k of ["a", "b", "c"]) m.put(k, "k", v[k], 0);
    assert.equal(m.get("a", 0, () => 0), v.a); // a is now the newest
    m.put("d", "k", v.d, 0); // evicts b, the least recently used
    assert.equal(m.get("b", 0, () => 0), undefined);
    assert.ok(v.b.every((x) => x === 0), "an evicted value is zero-filled");
    assert.ok(v.a.every((x) => x === 1) && m.get("a", 0, () => 0) === v.a);
    assert.deepEqual([m.stats().entries, m.stats().evictions, m.stats().bytes], [3, 1, 3 * (100 + overhead)]);
  });

  it("an entry at or past the maximum age is never used, and wiped", () => {
    let t = 0;
    const m = bytesMemo(10_000, { maxAgeMs: 1000, now: () => t });
    const v = new Uint8Array(10).fill(7);
    m.put("x", "k", v, 0);
    t = 999;
    assert.equal(m.get("x", 5, (y) => y.length), v, "younger than the maximum age");
    t = 1000;
    assert.equal(m.get("x", 5, (y) => y.length), undefined, "at it (as the C++ and embedded memos)");
    assert.ok(v.every((x) => x === 0));
    const s = m.stats();
    assert.deepEqual([s.hits, s.misses, s.expired, s.entries, s.bytes, s.bytesNotSent, s.bytesNotReceived], [1, 1, 1, 0, 0, 5, 10]);
  });

  it("an expired entry is wiped by the next lookup or insert of any entry, not only its own", () => {
    let t = 0;
    const m = bytesMemo(10_000, { maxAgeMs: 1000, now: () => t });
    const old = new Uint8Array(10).fill(7);
    m.put("old", "k", old, 0);
    t = 600;
    const young = new Uint8Array(10).fill(8);
    m.put("young", "k", young, 0);
    assert.equal(m.get("old", 0, () => 0), old); // a hit does not renew its age
    t = 1001;
    assert.equal(m.get("young", 0, () => 0), young);
    assert.ok(old.every((x) => x === 0), "the expired plaintext stays in memory until its own lookup");
    assert.deepEqual([m.stats().entries, m.stats().expired, m.stats().bytes], [1, 1, 10 + overhead]);
    t = 1700;
    m.put("new", "k", new Uint8Array(10), 0);
    assert.ok(young.every((x) => x === 0), "an insert sweeps too");
    assert.deepEqual([m.stats().entries, m.stats().expired], [1, 2]);
  });

  it("a clock that went back: entries stamped in its future are never used", () => {
    let t = 5000;
    const m = bytesMemo(10_000, { maxAgeMs: 1000, now: () => t });
    const v = new Uint8Array(10).fill(7);
    m.put("x", "k", v, 0);
    t = 10; // Date.now() stepped back, say: the entry's age is unknown
    assert.equal(m.get("x", 0, () => 0), undefined);
    assert.ok(v.every((x) => x === 0));
  });

  it("both clocks: a sleep the monotonic clock missed, or a wall clock set back, expires the entry", () => {
    let mono = 0;
    let wall = 1_700_000_000_000;
    const m = bytesMemo(10_000, { maxAgeMs: 1000, now: () => mono, wallNow: () => wall });
    const slept = new Uint8Array(10).fill(7);
    m.put("slept", "k", slept, 0);
    wall += 999;
    assert.equal(m.get("slept", 0, () => 0), slept, "younger than the maximum age on both clocks");
    wall += 1; // the device slept: performance.now stood still, Date.now did not
    assert.equal(m.get("slept", 0, () => 0), undefined);
    assert.ok(slept.every((x) => x === 0));
    const setBack = new Uint8Array(10).fill(8);
    m.put("setBack", "k", setBack, 0);
    mono += 10;
    wall -= 1; // set back past the time it was kept: its age is unknown
    assert.equal(m.get("setBack", 0, () => 0), undefined);
    assert.ok(setBack.every((x) => x === 0));
    const young = new Uint8Array(10).fill(9);
    m.put("young", "k", young, 0);
    mono += 1000; // the monotonic clock alone says it is too old
    assert.equal(m.get("young", 0, () => 0), undefined);
    assert.deepEqual([m.stats().hits, m.stats().expired, m.stats().entries], [1, 3, 0]);
  });

  it("clear() also keeps out an answer under way for a key never dropped", () => {
    const m = bytesMemo(10_000);
    const generation = m.generation("k"); // read before a request is sent
    m.clear(); // sign-out while it is under way
    const late = new Uint8Array(8).fill(9);
    m.put("x", "k", late, generation);
    assert.equal(m.get("x", 0, () => 0), undefined, "remembered after clear()");
    assert.ok(late.every((x) => x === 0));
    m.put("x", "k", new Uint8Array(8), m.generation("k"));
    assert.equal(m.stats().entries, 1);
  });

  it("dropKey wipes that key's entries only, and an answer under way for it is not kept", () => {
    const m = bytesMemo(10_000);
    const mine = [new Uint8Array(8).fill(1), new Uint8Array(8).fill(2)];
    const other = new Uint8Array(8).fill(3);
    m.put("m1", "mine", mine[0], 0);
    m.put("m2", "mine", mine[1], 0);
    m.put("o1", "other", other, 0);
    const generation = m.generation("mine"); // read before a request is sent
    assert.equal(m.dropKey("mine"), 2);
    assert.ok(mine.every((v) => v.every((x) => x === 0)));
    assert.equal(m.get("o1", 0, () => 0), other);
    const late = new Uint8Array(8).fill(9);
    m.put("m3", "mine", late, generation); // the answer that was under way
    assert.equal(m.get("m3", 0, () => 0), undefined);
    assert.ok(late.every((x) => x === 0), "not kept, and wiped");
    m.put("m3", "mine", new Uint8Array(8), m.generation("mine"));
    assert.equal(m.stats().entries, 2);
  });

  it("a value larger than the budget is not kept; clear() wipes everything", () => {
    const m = bytesMemo(1000);
    const big = new Uint8Array(1000).fill(5);
    m.put("big", "k", big, 0);
    assert.equal(m.stats().entries, 0);
    assert.ok(big.every((x) => x === 0));
    const small = new Uint8Array(10).fill(5);
    m.put("s", "k", small, 0);
    m.clear();
    assert.ok(small.every((x) => x === 0));
    assert.equal(m.stats().bytes, 0);
  });
});

describe("a result nobody takes", () => {
  // A call as the client queues it: settled once by the first outcome (its answer, its deadline
  // or its abort).
  const call = () => {
    const got = [];
    return { got, p: { settled: false, resolve: (v) => got.push(["resolved", v]), reject: (e) => got.push(["rejected", e]) } };
  };

  it("an answer that arrives after the caller's deadline or abort is zero-filled; a taken one is not", () => {
    const taken = call();
    const mine = { plaintext: new Uint8Array(16).fill(1), keyVersion: 1, memoHit: false, local: false };
    settlePending(taken.p, true, mine);
    assert.deepEqual(taken.got, [["resolved", mine]]);
    assert.ok(mine.plaintext.every((x) => x === 1), "the caller's to wipe");

    for (const late of [
      { plaintext: new Uint8Array(16).fill(2), keyVersion: 1, memoHit: false, local: false }, // open, boxOpen
      { sharedKey: new Uint8Array(32).fill(3), keyVersion: 1, memoHit: false, local: false }, // derive
    ]) {
      const gone = call();
      settlePending(gone.p, false, new ConnectError("the call was aborted", Code.Canceled));
      settlePending(gone.p, true, late);
      assert.equal(gone.got.length, 1);
      assert.equal(gone.got[0][1].code, Code.Canceled);
      assert.ok(Object.values(late).filter((v) => v instanceof Uint8Array).every((b) => b.every((x) => x === 0)), "wiped");
    }
    const sealed = { envelope: new Uint8Array(40).fill(4), keyVersion: 1 }; // no secret in it
    const gone = call();
    settlePending(gone.p, false, new ConnectError("the call's deadline passed", Code.DeadlineExceeded));
    settlePending(gone.p, true, sealed);
    assert.ok(sealed.envelope.every((x) => x === 4));
  });
});

describe("Digester", () => {
  it("salted per instance, framed per field", async () => {
    const a = Digester.create(nodeCrypto);
    const b = Digester.create(nodeCrypto);
    const env = new Uint8Array([1, 2, 3, 4]);
    assert.equal(await a.digest("open", "k", env), await a.digest("open", "k", env));
    assert.notEqual(await a.digest("open", "k", env), await b.digest("open", "k", env), "another salt");
    // Framing: moving bytes between fields changes the digest.
    assert.notEqual(await a.digest("open", "k1", new Uint8Array([2])), await a.digest("open", "k", new Uint8Array([0x31, 2])));
    assert.match(await a.digest("verify", env), /^[A-Za-z0-9_-]{43}$/);
  });

  it("a number field is never wrapped: out of uint32 it is refused, not digested as another", async () => {
    const a = Digester.create(nodeCrypto);
    for (const f of [2 ** 32 + 1, 1.5, -1, NaN]) await assert.rejects(a.digest("derive", "k", f), RangeError, String(f));
    assert.notEqual(await a.digest("derive", "k", 0xffffffff), await a.digest("derive", "k", 0));
  });

  it("a provider of the wrong shape is refused", () => {
    assert.throws(() => Digester.create({ sha256: () => new Uint8Array(32), randomBytes: () => new Uint8Array(8) }), /32 bytes/);
  });
});

describe("server retry delays", () => {
  it("RetryInfo detail first, then Retry-After seconds or date", () => {
    const info = toBinary(RetryInfoSchema, create(RetryInfoSchema, { retryDelay: { seconds: 1n, nanos: 250_000_000 } }));
    const withDetail = new ConnectError("busy", Code.ResourceExhausted, { "retry-after": "9" });
    withDetail.details.push({ type: "google.rpc.RetryInfo", value: info });
    assert.equal(serverRetryDelayMs(withDetail), 1250);
    assert.equal(serverRetryDelayMs(new ConnectError("busy", Code.Unavailable, { "retry-after": "3" })), 3000);
    const at = Date.parse("Wed, 21 Oct 2026 07:28:00 GMT");
    assert.equal(serverRetryDelayMs(new ConnectError("x", Code.Unavailable, { "retry-after": "Wed, 21 Oct 2026 07:28:02 GMT" }), at), 2000);
    assert.equal(serverRetryDelayMs(new ConnectError("x", Code.Unavailable, { "retry-after": "soon" })), undefined);
    assert.equal(serverRetryDelayMs(new ConnectError("x", Code.Unavailable)), undefined);
  });
});

// A loopback HTTP/1.1 responder for one path: each request takes the next answer of `script`
// (the last one repeats) and is recorded with its arrival time.
function responder() {
  const state = { script: [], seen: [] };
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      state.seen.push({ at: performance.now(), url: req.url, headers: req.headers });
      const answer = state.script[Math.min(state.seen.length - 1, state.script.length - 1)];
      res.writeHead(answer.status, answer.headers);
      res.end(answer.body ?? "");
    });
  });
  return {
    state,
    listen: () => new Promise((r) => server.listen(0, "127.0.0.1", () => r(`http://127.0.0.1:${server.address().port}`))),
    close: () => new Promise((r) => { server.close(() => r()); server.closeAllConnections(); }),
  };
}

const okListKeys = { status: 200, headers: { "content-type": "application/proto" }, body: "" }; // an empty ListKeysResponse
const retryInfoBytes = (ms) =>
  toBinary(RetryInfoSchema, create(RetryInfoSchema, { retryDelay: { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 } }));
const connectRefusal = (status, code, { retryAfter, retryMs } = {}) => ({
  status,
  headers: { "content-type": "application/json", ...(retryAfter !== undefined ? { "retry-after": String(retryAfter) } : {}) },
  body: JSON.stringify({
    code,
    message: "server overloaded; retry later",
    ...(retryMs !== undefined
      ? { details: [{ type: "google.rpc.RetryInfo", value: Buffer.from(retryInfoBytes(retryMs)).toString("base64").replace(/=+$/, "") }] }
      : {}),
  }),
});

describe("retries", () => {
  const r = responder();
  let base;
  before(async () => (base = await r.listen()));
  after(() => r.close());
  const client = (extra = {}) =>
    createOffloadClient({ transport: createFetchTransport({ baseUrl: base }), random: () => 0.5, ...extra });
  const gaps = () => r.state.seen.slice(1).map((s, i) => s.at - r.state.seen[i].at);

  it("RESOURCE_EXHAUSTED with RetryInfo: waits at least the delay, then succeeds", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(429, "resource_exhausted", { retryMs: 300 }), okListKeys];
    const c = client();
    await c.services.keys.listKeys({});
    assert.equal(r.state.seen.length, 2);
    assert.ok(gaps()[0] >= 300 - 5, `waited ${gaps()[0]} ms`);
    assert.deepEqual([c.stats().requests, c.stats().retries], [2, 1]);
  });

  it("UNAVAILABLE with Retry-After (HTTP 503): waits at least that many seconds", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(503, "unavailable", { retryAfter: 1 }), okListKeys];
    const c = client();
    await c.services.keys.listKeys({});
    assert.equal(r.state.seen.length, 2);
    assert.ok(gaps()[0] >= 1000 - 5, `waited ${gaps()[0]} ms`);
  });

  it("gRPC-Web: RetryInfo in grpc-status-details-bin", async () => {
    r.state.seen = [];
    const status = create(StatusSchema, {
      code: Code.ResourceExhausted,
      message: "busy",
      details: [anyPack(RetryInfoSchema, create(RetryInfoSchema, { retryDelay: { seconds: 0n, nanos: 400_000_000 } }))],
    });
    r.state.script = [
      {
        status: 200,
        headers: {
          "content-type": "application/grpc-web+proto",
          "grpc-status": "8",
          "grpc-message": "busy",
          "grpc-status-details-bin": Buffer.from(toBinary(StatusSchema, status)).toString("base64").replace(/=+$/, ""),
        },
      },
      { status: 200, headers: { "content-type": "application/grpc-web+proto" }, body: Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), Buffer.from([0x80, 0, 0, 0, 16]), Buffer.from("grpc-status: 0\r\n")]) },
    ];
    const c = createOffloadClient({ transport: createNodeTransport({ baseUrl: base, protocol: "grpc-web", httpVersion: "1.1" }), random: () => 0.5 });
    await c.services.keys.listKeys({});
    assert.equal(r.state.seen.length, 2);
    assert.ok(gaps()[0] >= 400 - 5, `waited ${gaps()[0]} ms`);
  });

  it("no delay given: backoff with jitter, up to maxAttempts, then the error", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(503, "unavailable")];
    const c = client({ retry: { maxAttempts: 4, initialBackoffMs: 40 } });
    await assert.rejects(c.services.aead.open({ keyId: "k", envelope: new Uint8Array(40) }), (e) => e.code === Code.Unavailable);
    assert.equal(r.state.seen.length, 4);
    // random() = 0.5 of 40, 80, 160 ms
    gaps().forEach((g, i) => assert.ok(g >= 20 * 2 ** i - 5, `gap ${i}: ${g} ms`));
    assert.deepEqual([c.stats().requests, c.stats().retries], [4, 3]);
  });

  it("a delay that would pass the deadline: no retry, the refusal at once", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(429, "resource_exhausted", { retryMs: 5000 }), okListKeys];
    const c = client();
    await assert.rejects(c.services.keys.listKeys({}, { timeoutMs: 1000 }), (e) => e.code === Code.ResourceExhausted);
    assert.equal(r.state.seen.length, 1);
  });

  it("a key change is not retried after UNAVAILABLE unless the server says it did not run", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(503, "unavailable"), okListKeys];
    const c = client();
    await assert.rejects(c.services.keys.rotateKey({ keyId: "k" }), (e) => e.code === Code.Unavailable);
    assert.equal(r.state.seen.length, 1);
    r.state.seen = [];
    r.state.script = [connectRefusal(503, "unavailable", { retryMs: 10 }), { ...okListKeys }];
    await c.services.keys.rotateKey({ keyId: "k" });
    assert.equal(r.state.seen.length, 2);
  });

  it("fetch to a closed port: UNAVAILABLE (not fetch's UNKNOWN), retried up to maxAttempts", async () => {
    const port = await new Promise((res) => {
      const s = createServer().listen(0, "127.0.0.1", () => {
        const p = s.address().port;
        s.close(() => res(p)); // nothing listens there any more
      });
    });
    for (const protocol of ["connect", "grpc-web"]) {
      let attempts = 0;
      const c = createOffloadClient({
        baseUrl: `http://127.0.0.1:${port}`,
        protocol,
        fetch: (input, init) => (attempts++, fetch(input, init)),
        retry: { maxAttempts: 3, initialBackoffMs: 10 },
        random: () => 0.5,
      });
      await assert.rejects(c.services.keys.listKeys({}), (e) => e instanceof ConnectError && e.code === Code.Unavailable && e.cause instanceof TypeError);
      assert.equal(attempts, 3, protocol);
      assert.deepEqual([c.stats().requests, c.stats().retries], [3, 2], protocol);
    }
  });

  it("a malformed per-call header is the caller's INVALID_ARGUMENT, and nothing is sent", async () => {
    let attempts = 0;
    const c = createOffloadClient({
      baseUrl: "http://127.0.0.1:1",
      fetch: (input, init) => (attempts++, fetch(input, init)),
      retry: false,
    });
    const plaintext = new Uint8Array([1, 2, 3]);
    await assert.rejects(
      c.seal({ keyId: "k", plaintext }, { headers: { "x-tenant": "a\r\nx-evil: 1" } }),
      (e) => e instanceof ConnectError && e.code === Code.InvalidArgument && /headers/.test(e.message),
    );
    assert.equal(attempts, 0);
    assert.deepEqual([...plaintext], [1, 2, 3]); // the caller's bytes are the caller's
  });

  it("UNKNOWN answered by the server is not retried", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(500, "unknown"), okListKeys];
    await assert.rejects(client().services.keys.listKeys({}), (e) => e.code === Code.Unknown);
    assert.equal(r.state.seen.length, 1);
  });

  it("retry: false sends once", async () => {
    r.state.seen = [];
    r.state.script = [connectRefusal(429, "resource_exhausted", { retryMs: 10 }), okListKeys];
    await assert.rejects(client({ retry: false }).services.keys.listKeys({}), (e) => e.code === Code.ResourceExhausted);
    assert.equal(r.state.seen.length, 1);
  });
});
