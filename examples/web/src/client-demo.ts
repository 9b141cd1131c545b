// The TypeScript client's own memo at work in a browser: the page opened with ?scenario=NAME runs
// one of the scenarios below (?scenario=all runs them all) instead of the two-transport demo.
// Each makes its own key and blobs through an "admin" client (another app, say: the client under
// watch sees none of its work), runs the "phone" client against them, checks what it sees, and
// deletes the key. The numbers go on the page and into window.offloadResults; tests/e2e/web
// counts the same calls at the server.
//
//   resume    27 blobs of 54-56 KB opened twice with the open memo on: one BatchOpen, then nothing
//   lru       a memo smaller than the set: 3 live blobs re-read between 20 new ones stay
//   tampered  a tampered envelope fails every time and is never remembered
//   disabled  the key disabled behind the phone's back: its entries go at the first refusal
//   expiry    ... or once older than the maximum age (the page's own clock, moved forward)
//   token     the first token has expired: the provider is asked once more, the calls go on
//   batching  27 concurrent opens (one tampered): one BatchOpen, each caller its own answer
//   bench     (not in "all") the resume of tests/bench/mobile_resume.mjs (?memo=on|off
//             &batching=on|off): makes the blobs, then reads them at each
//             window.offloadBenchRound(); nothing checked but the plaintexts
// ?protocol=grpc-web uses gRPC-Web instead of Connect. The token scenario takes its tokens from
// this page's own origin (GET /token?for=phone|admin&refresh=true|false), as an app would from
// its backend.
import {
  Code,
  ConnectError,
  createOffloadClient,
  KeyType,
  type ClientStats,
  type OffloadClient,
  type OffloadClientOptions,
  type OpenRequest,
  type TokenProvider,
} from "@crypto-offload/client";

import { randomBytes } from "./webcrypto.js";

type Protocol = "connect" | "grpc-web";

interface Blob extends OpenRequest {
  plaintext: Uint8Array;
}

export interface ScenarioResult {
  name: string;
  ok: boolean;
  error?: string;
  lines: string[];
  data: Record<string, unknown>;
}

interface DemoResults {
  mode: "client";
  server: string;
  protocol: Protocol;
  status: string;
  scenarios: ScenarioResult[];
}

declare global {
  interface Window {
    offloadClientResults?: DemoResults;
  }
}

const kScenarios = ["resume", "lru", "tampered", "disabled", "expiry", "token", "batching"] as const;

function check(cond: unknown, what: string): asserts cond {
  if (!cond) throw new Error(what);
}

function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function codeName(e: unknown): string {
  return e instanceof ConnectError ? Code[e.code] : `not a ConnectError: ${String(e)}`;
}

// WebCrypto's getRandomValues takes at most 65,536 bytes at a time.
function randomPlaintext(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let at = 0; at < n; at += 65536) out.set(randomBytes(Math.min(65536, n - at)), at);
  return out;
}

const kb = (n: number) => `${(n / 1000).toFixed(1)} KB`;

class Scenario {
  readonly result: ScenarioResult;
  readonly admin: OffloadClient;
  private keys: string[] = [];
  keepKeys = false; // the benchmark's key outlives the page's run

  constructor(
    readonly name: string,
    readonly server: string,
    readonly protocol: Protocol,
    readonly tokens: (who: "phone" | "admin") => TokenProvider | undefined,
  ) {
    this.result = { name, ok: false, lines: [], data: {} };
    this.admin = createOffloadClient({ baseUrl: server, protocol, tokenProvider: tokens("admin"), memo: { verify: false } });
  }

  line(text: string): void {
    this.result.lines.push(text);
  }

  phone(extra: Partial<OffloadClientOptions>): OffloadClient {
    return createOffloadClient({ baseUrl: this.server, protocol: this.protocol, tokenProvider: this.tokens("phone"), ...extra });
  }

  async newKey(): Promise<string> {
    const keyId = `web-${this.name}-${Array.from(randomBytes(4), (b) => b.toString(16).padStart(2, "0")).join("")}`;
    await this.admin.services.keys.createKey({ keyId, type: KeyType.XCHACHA20_POLY1305 });
    this.keys.push(keyId);
    return keyId;
  }

  // `n` blobs of 54,000-56,000 random bytes sealed by the admin client (one BatchSeal).
  async blobs(keyId: string, n: number, from = 0): Promise<Blob[]> {
    const inputs = Array.from({ length: n }, (_, i) => ({
      keyId,
      plaintext: randomPlaintext(54000 + (((from + i) * 977) % 2001)),
      associatedData: new TextEncoder().encode(`user-42/blob-${from + i}`),
    }));
    const sealed = await Promise.all(inputs.map((q) => this.admin.seal(q)));
    return inputs.map((q, i) => ({ ...q, envelope: sealed[i].envelope }));
  }

  async cleanup(): Promise<void> {
    if (this.keepKeys) return;
    for (const keyId of this.keys) await this.admin.services.keys.deleteKey({ keyId });
  }
}

function openStats(s: ClientStats) {
  const o = s.memos.open!;
  return { requests: s.requests, batches: s.batches, batchedItems: s.batchedItems, tokenRefreshes: s.tokenRefreshes,
    hits: o.hits, misses: o.misses, entries: o.entries, bytes: o.bytes, evictions: o.evictions, expired: o.expired,
    droppedForKey: o.droppedForKey, bytesNotSent: o.bytesNotSent, bytesNotReceived: o.bytesNotReceived };
}

const scenarios: Record<(typeof kScenarios)[number], (s: Scenario) => Promise<void>> = {
  async resume(s) {
    const keyId = await s.newKey();
    const blobs = await s.blobs(keyId, 27);
    const phone = s.phone({ memo: { open: { maxAgeMs: 5 * 60_000 } } });
    const pass = async () => {
      const requests = phone.stats().requests;
      const t0 = performance.now();
      const opened = await Promise.all(blobs.map((b) => phone.open(b)));
      const ms = performance.now() - t0;
      opened.forEach((o, i) => check(equalBytes(o.plaintext, blobs[i].plaintext), `blob ${i} opened to other bytes`));
      return { requests: phone.stats().requests - requests, local: opened.filter((o) => o.local).length, ms };
    };
    const first = await pass();
    const second = await pass();
    const stats = openStats(phone.stats());
    s.result.data = { blobs: blobs.length, bytes: blobs.reduce((n, b) => n + b.plaintext.length, 0), first, second, stats };
    s.line(`27 blobs (${kb(blobs[0].plaintext.length)}-${kb(Math.max(...blobs.map((b) => b.plaintext.length)))}) sealed by another client`);
    s.line(`first resume: ${first.requests} request (one BatchOpen of 27), ${first.local} from the memo, ${first.ms.toFixed(0)} ms`);
    s.line(`second resume: ${second.requests} requests, ${second.local} from the memo, ${second.ms.toFixed(0)} ms; ` +
      `${kb(stats.bytesNotSent)} not sent, ${kb(stats.bytesNotReceived)} not received`);
    check(first.requests === 1 && first.local === 0, "the first resume should make one request");
    check(second.requests === 0 && second.local === 27, "the second resume should make no request");
  },

  async lru(s) {
    const keyId = await s.newKey();
    const live = await s.blobs(keyId, 3, 100);
    const fresh = await s.blobs(keyId, 20, 200);
    const maxBytes = 8 * 56_200; // about 8 blobs: fewer than the 23
    const phone = s.phone({ batching: false, memo: { open: { maxAgeMs: 5 * 60_000, maxBytes } } });
    let liveLocal = 0;
    let freshLocal = 0;
    for (const b of live) await phone.open(b);
    for (const b of fresh) {
      if ((await phone.open(b)).local) freshLocal++;
      for (const l of live) if ((await phone.open(l)).local) liveLocal++;
    }
    const stats = openStats(phone.stats());
    s.result.data = { maxBytes, liveLocal, freshLocal, stats };
    s.line(`memo of ${kb(maxBytes)} for 23 blobs: 3 live ones re-read after each of 20 new ones`);
    s.line(`live re-reads from the memo: ${liveLocal} of 60; requests ${stats.requests} (one per distinct blob); ` +
      `evictions ${stats.evictions}, ${stats.entries} entries held`);
    check(liveLocal === 60, `live blobs evicted: ${60 - liveLocal} re-reads went to the server`);
    check(stats.requests === 23 && freshLocal === 0, `expected 23 requests, got ${stats.requests}`);
  },

  async tampered(s) {
    const keyId = await s.newKey();
    const [good, other] = await s.blobs(keyId, 2, 300);
    const bad = { ...good, envelope: good.envelope.slice() };
    bad.envelope[bad.envelope.length - 1] ^= 1;
    const phone = s.phone({ memo: { open: { maxAgeMs: 5 * 60_000 } } });
    await phone.open(good);
    const codes: string[] = [];
    for (let i = 0; i < 3; i++) {
      try {
        await phone.open(bad);
        codes.push("OK");
      } catch (e) {
        codes.push(codeName(e));
      }
    }
    const batch = await Promise.allSettled([phone.open(bad), phone.open(other), phone.open(good)]);
    const stats = openStats(phone.stats());
    s.result.data = {
      codes,
      batch: batch.map((r) => (r.status === "fulfilled" ? (r.value.local ? "local" : "sent") : codeName(r.reason))),
      stats,
    };
    s.line(`a tampered envelope, opened 3 times: ${codes.join(", ")}`);
    s.line(`with two good ones in one tick: ${(s.result.data.batch as string[]).join(", ")}; ${stats.entries} entries held`);
    check(codes.every((c) => c === "InvalidArgument"), "the tampered envelope should fail every time");
    check(JSON.stringify(s.result.data.batch) === '["InvalidArgument","sent","local"]', "only the tampered caller fails");
    check(stats.entries === 2 && stats.droppedForKey === 0, "an item error must not drop the key's entries");
  },

  async disabled(s) {
    const keyId = await s.newKey();
    const blobs = await s.blobs(keyId, 5, 400);
    const phone = s.phone({ memo: { open: { maxAgeMs: 5 * 60_000 } } });
    await Promise.all(blobs.slice(0, 4).map((b) => phone.open(b)));
    await s.admin.services.keys.disableKey({ keyId }); // behind the phone's back
    const withinAge = (await phone.open(blobs[0])).local;
    let refusal = "OK";
    try {
      await phone.open(blobs[4]);
    } catch (e) {
      refusal = codeName(e);
    }
    const dropped = phone.stats().memos.open!.droppedForKey;
    const after: string[] = [];
    for (const b of blobs.slice(0, 4)) {
      try {
        await phone.open(b);
        after.push("OK");
      } catch (e) {
        after.push(codeName(e));
      }
    }
    const stats = openStats(phone.stats());
    s.result.data = { withinAge, refusal, dropped, after, stats };
    s.line(`4 blobs remembered; the key disabled by the admin; a remembered blob still opens locally: ${withinAge}`);
    s.line(`a new blob: ${refusal}; the key's ${dropped} entries dropped at once; the 4 again: ${after.join(", ")}`);
    check(withinAge && refusal === "FailedPrecondition" && dropped === 4, "the refusal should drop the 4 entries");
    check(after.every((c) => c === "FailedPrecondition"), "after the refusal every open should be asked and refused");
  },

  async expiry(s) {
    const keyId = await s.newKey();
    const blobs = await s.blobs(keyId, 3, 500);
    let clock = 0; // this page's clock for the phone's memo, moved by hand
    const phone = s.phone({ now: () => clock, memo: { open: { maxAgeMs: 30_000 } } });
    await Promise.all(blobs.map((b) => phone.open(b)));
    await s.admin.services.keys.disableKey({ keyId });
    clock += 29_000;
    const within = (await Promise.all(blobs.map((b) => phone.open(b)))).filter((o) => o.local).length;
    clock += 2_000;
    const after = (await Promise.allSettled(blobs.map((b) => phone.open(b)))).map((r) =>
      r.status === "fulfilled" ? "OK" : codeName(r.reason),
    );
    const stats = openStats(phone.stats());
    s.result.data = { within, after, stats };
    s.line(`maximum age 30 s; the key disabled; 29 s later ${within} of 3 still open from the memo`);
    s.line(`31 s after: never used (${stats.expired} expired), asked again: ${after.join(", ")}`);
    check(within === 3, "within the maximum age the entries are used");
    check(stats.expired === 3 && after.every((c) => c === "FailedPrecondition"), "past it they are not");
  },

  async token(s) {
    const keyId = await s.newKey();
    const blobs = await s.blobs(keyId, 27, 600);
    const phone = s.phone({ memo: { open: { maxAgeMs: 5 * 60_000 } } });
    const opened = await Promise.all(blobs.map((b) => phone.open(b)));
    opened.forEach((o, i) => check(equalBytes(o.plaintext, blobs[i].plaintext), `blob ${i}`));
    const stats = openStats(phone.stats());
    s.result.data = { opened: opened.length, stats };
    s.line(`27 opens with an expired token: refused once, the provider asked again ` +
      `(${stats.tokenRefreshes} refresh), ${stats.requests} requests in all`);
    check(stats.tokenRefreshes === 1 && stats.requests === 2, "one refusal, one refresh, one retry");
  },

  async batching(s) {
    const keyId = await s.newKey();
    const blobs = await s.blobs(keyId, 27, 700);
    const bad = { ...blobs[13], envelope: blobs[13].envelope.slice() };
    bad.envelope[40] ^= 0x80;
    const phone = s.phone({});
    const settled = await Promise.allSettled(blobs.map((b, i) => phone.open(i === 13 ? bad : b)));
    const answers = settled.map((r, i) =>
      r.status === "fulfilled" ? (equalBytes(r.value.plaintext, blobs[i].plaintext) ? "OK" : "WRONG") : codeName(r.reason),
    );
    const st = phone.stats();
    s.result.data = { answers, requests: st.requests, batches: st.batches, batchedItems: st.batchedItems };
    s.line(`27 opens in one tick (the 14th tampered): ${st.requests} request, ${st.batches} BatchOpen of ${st.batchedItems} items`);
    s.line(`answers: ${answers.filter((a) => a === "OK").length} plaintexts, the 14th ${answers[13]}`);
    check(st.requests === 1 && st.batchedItems === 27, "27 opens should make one BatchOpen");
    check(answers.every((a, i) => a === (i === 13 ? "InvalidArgument" : "OK")), "each caller its own answer");
  },
};

// The benchmark's resume (tests/bench/mobile_resume.mjs): 27 blobs of ~55 KB made here, then
// read by one client (its open memo and auto-batching on or off as ?memo=on|off&batching=on|off
// say) each time the benchmark calls window.offloadBenchRound(), so that it can count the bytes
// of each resume apart. The key is left to the (throwaway) server.
declare global {
  interface Window {
    offloadBenchRound?: () => Promise<{ ms: number; requests: number; local: number }>;
  }
}
async function bench(s: Scenario): Promise<void> {
  const q = new URLSearchParams(location.search);
  const memo = q.get("memo") === "on";
  const batching = q.get("batching") !== "off";
  const keyId = await s.newKey();
  s.keepKeys = true;
  const blobs = await s.blobs(keyId, 27);
  const phone = s.phone({ batching, memo: memo ? { open: { maxAgeMs: 10 * 60_000 } } : { verify: false } });
  window.offloadBenchRound = async () => {
    const requests = phone.stats().requests;
    const t0 = performance.now();
    const opened = await Promise.all(blobs.map((b) => phone.open(b)));
    const ms = performance.now() - t0;
    opened.forEach((o, j) => check(equalBytes(o.plaintext, blobs[j].plaintext), `blob ${j}`));
    return { ms, requests: phone.stats().requests - requests, local: opened.filter((o) => o.local).length };
  };
  s.result.data = { memo, batching, keyId };
  s.line(`27 blobs ready under ${keyId}; memo ${memo ? "on" : "off"}, batching ${batching ? "on" : "off"}: ` +
    "window.offloadBenchRound() reads them once");
}

// Tokens from this page's own origin (the token scenario's server wants them).
function originTokens(who: "phone" | "admin"): TokenProvider {
  return async ({ refresh }) => {
    const r = await fetch(`/token?for=${who}&refresh=${refresh}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`GET /token: HTTP ${r.status}`);
    return (await r.text()).trim();
  };
}

export async function runClientDemo(server: string, which: string, protocol: Protocol): Promise<void> {
  const names = which === "all" ? [...kScenarios] : which.split(",");
  const results: DemoResults = { mode: "client", server, protocol, status: "running", scenarios: [] };
  const setStatus = (status: string) => {
    results.status = status;
    document.body.dataset.status = status;
    const el = document.getElementById("status")!;
    el.textContent = status;
    el.className = status === "done" ? "ok" : status.startsWith("error") ? "bad" : "";
    window.offloadClientResults = results;
  };
  document.getElementById("lanes-demo")!.hidden = true;
  document.getElementById("lanes-lead")!.hidden = true;
  document.getElementById("client-demo")!.hidden = false;
  document.getElementById("server")!.textContent = server;
  document.getElementById("origin")!.textContent = location.origin;
  document.getElementById("identity")!.textContent = names.includes("token") ? "tokens from this origin's /token" : "none";
  setStatus("running");
  const list = document.getElementById("client-scenarios")!;
  const problems: string[] = [];
  for (const name of names) {
    const run = name === "bench" ? bench : scenarios[name as (typeof kScenarios)[number]];
    const tokens = name === "token" ? originTokens : () => undefined;
    const s = new Scenario(name, server, protocol, tokens);
    const li = document.createElement("li");
    li.dataset.scenario = name;
    list.append(li);
    try {
      if (!run) throw new Error(`no scenario "${name}" (${kScenarios.join(", ")}, all)`);
      await run(s);
      s.result.ok = true;
    } catch (e) {
      s.result.error = e instanceof Error ? e.message : String(e);
      problems.push(`${name}: ${s.result.error}`);
    }
    try {
      await s.cleanup();
    } catch (e) {
      problems.push(`${name} cleanup: ${e instanceof Error ? e.message : String(e)}`);
    }
    results.scenarios.push(s.result);
    li.className = s.result.ok ? "ok" : "bad";
    const h = document.createElement("b");
    h.textContent = name;
    const ul = document.createElement("ul");
    for (const text of [...s.result.lines, ...(s.result.error ? [`error: ${s.result.error}`] : [])]) {
      const x = document.createElement("li");
      x.textContent = text;
      ul.append(x);
    }
    li.append(h, ul);
  }
  setStatus(problems.length === 0 ? "done" : `error: ${problems[0]}`);
}
