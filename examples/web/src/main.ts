// The crypto-offload web example: a static page that calls the service's HTTP port from the
// browser with the TypeScript client (client/ts, @crypto-offload/client), once over the Connect
// protocol and once over gRPC-Web.
//
// What it does, in order (and shows on the page):
//   1. makes its inputs with WebCrypto: an Ed25519 signature, an X25519 key pair, a random
//      AES-256-GCM key and an envelope sealed with it;
//   2. creates an X25519 key (KeyService.CreateKey) and imports the AES key (ImportKey) on the
//      server under random key ids;
//   3. runs each step once over Connect, then once over gRPC-Web with the same input, checking
//      every answer against WebCrypto and the two answers against each other; the second call
//      of a step is served from the server's memo (memo_hit true), except for the tampered
//      signature (invalid results are never remembered);
//   4. deletes the two keys.
// Each transport is one OffloadClient (no open memo here, so that every step reaches the server
// and shows the server's memo at work; ?scenario= shows the client's own memos: client-demo.ts).
// The query string names the service: ?server=http://127.0.0.1:8080 (the default). The server
// must allow this page's origin: offload_server --http_cors_origins=<origin>. A server that wants
// callers to prove who they are (--jwks_file, --require_identity) gets a bearer token on every
// call: the page takes it from its URL fragment, #token=<JWT> (a fragment is never sent to any
// server, so the token stays out of request lines and access logs), and the client's token
// provider gives it to both transports. A real app gets the token from its identity provider's
// SDK, and the client asks its provider again when the server refuses a token (docs/mobile.md).
// Machine-readable outcome: <body data-status="running" | "done" | "error: ...">, and
// window.offloadResults (the Results below).
import {
  Code,
  ConnectError,
  createOffloadClient,
  DeriveOutput,
  KeyType,
  type CallOptions,
  type OffloadClient,
} from "@crypto-offload/client";

import { runClientDemo } from "./client-demo.js";
import * as wc from "./webcrypto.js";

type LaneId = "connect" | "grpc-web";

interface Lane {
  id: LaneId;
  label: string;
  api: OffloadClient;
}

// What one call returned: `value` is compared across the two transports, `shown` is displayed.
interface Outcome {
  value: string;
  memoHit: boolean;
  shown: string;
}

interface Cell {
  ok: boolean;
  skipped: boolean;
  error?: string;
  outcome?: Outcome;
}

interface StepRecord {
  id: string;
  title: string;
  cells: Partial<Record<LaneId, Cell>>;
  // Both calls succeeded and returned the same value; null when one did not succeed.
  equal: boolean | null;
}

interface Results {
  server: string;
  origin: string;
  bearerToken: boolean;  // whether calls carry a token (never the token itself)
  status: string;
  keys: { x25519?: string; aead?: string };
  setup: { ok: boolean; error?: string; lines: string[] };
  steps: StepRecord[];
  cleanup: { ok: boolean; error?: string; lines: string[] };
}

declare global {
  interface Window {
    offloadResults?: Results;
  }
}

const callOptions: CallOptions = { timeoutMs: 5000 };

// One client per transport. The verify memo is on (the default) but each step verifies once per
// client; the open and derive memos are off, so every call reaches the server.
function makeClient(server: string, protocol: "connect" | "grpc-web", token: string): OffloadClient {
  return createOffloadClient({
    baseUrl: server,
    protocol,
    // The page has one token (#token=): asked again after a refusal, it has no fresh one.
    tokenProvider: token
      ? ({ refresh }) => {
          if (refresh) throw new Error("the server refused the #token= token: open the page with a fresh one");
          return token;
        }
      : undefined,
  });
}

// An error as the page shows it. A fetch that the browser refused (CORS) or could not send
// surfaces as Code.Unavailable caused by a TypeError ("Failed to fetch" in Chromium): the
// client's fetch transport retried it within the deadline, as it retries a server that is down.
function describeError(e: unknown): string {
  if (e instanceof ConnectError) {
    if (e.code === Code.Unavailable && e.cause instanceof TypeError) {
      return `${e.message} (network error or refused by the browser: is this page's origin in the ` +
        `server's --http_cors_origins? The browser console says which)`;
    }
    return e.message;
  }
  return e instanceof Error ? e.message : String(e);
}

function short(h: string): string {
  return h.length > 16 ? `${h.slice(0, 16)}…` : h;
}

function $(id: string): HTMLElement {
  const el = document.getElementById(id);
  if (!el) throw new Error(`index.html has no #${id}`);
  return el;
}

function addLine(listId: string, text: string, cls?: string): void {
  const li = document.createElement("li");
  li.textContent = text;
  if (cls) li.className = cls;
  $(listId).append(li);
}

function setStatus(results: Results, status: string): void {
  results.status = status;
  document.body.dataset.status = status;
  const el = $("status");
  el.textContent = status;
  el.className = status === "done" ? "ok" : status.startsWith("error") ? "bad" : "";
  window.offloadResults = results;
}

function renderCell(td: HTMLTableCellElement, step: string, lane: LaneId, cell: Cell): void {
  td.dataset.step = step;
  td.dataset.transport = lane;
  td.dataset.ok = String(cell.ok);
  td.replaceChildren();
  if (cell.skipped) {
    td.className = "skipped";
    td.textContent = cell.error ?? "skipped";
    return;
  }
  if (!cell.ok || !cell.outcome) {
    td.className = "bad";
    td.textContent = `error: ${cell.error}`;
    return;
  }
  td.dataset.memoHit = String(cell.outcome.memoHit);
  td.className = "ok";
  const result = document.createElement("div");
  result.textContent = cell.outcome.shown;
  const memo = document.createElement("div");
  memo.className = cell.outcome.memoHit ? "memo hit" : "memo";
  memo.textContent = `memo_hit: ${cell.outcome.memoHit}`;
  td.append(result, memo);
}

async function main(): Promise<void> {
  const params = new URLSearchParams(location.search);
  const token = new URLSearchParams(location.hash.slice(1)).get("token") ?? "";
  const server = (params.get("server") ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
  if (params.has("scenario")) {
    await runClientDemo(server, params.get("scenario")!, params.get("protocol") === "grpc-web" ? "grpc-web" : "connect");
    return;
  }
  const results: Results = {
    server,
    origin: location.origin,
    bearerToken: token !== "",
    status: "running",
    keys: {},
    setup: { ok: false, lines: [] },
    steps: [],
    cleanup: { ok: false, lines: [] },
  };
  $("server").textContent = server;
  $("origin").textContent = location.origin;
  $("identity").textContent = token ? "a bearer token (from #token=)" : "none (anonymous calls)";
  setStatus(results, "running");

  const lanes: Lane[] = [
    {
      id: "connect",
      label: "Connect",
      api: makeClient(server, "connect", token),
    },
    {
      id: "grpc-web",
      label: "gRPC-Web",
      api: makeClient(server, "grpc-web", token),
    },
  ];
  const problems: string[] = [];

  // 1. Inputs, made here.
  const suffix = wc.hex(wc.randomBytes(4));
  const x25519KeyId = `web-x25519-${suffix}`;
  const aeadKeyId = `web-aes-${suffix}`;
  const associatedData = wc.utf8("web-example");
  const browserText = "a blob sealed in the browser by WebCrypto";
  const serverText = "a blob sealed by the server";
  const signed = await wc.ed25519Sign(wc.utf8("hello from the browser"));
  const tampered = signed.signature.slice();
  tampered[63] ^= 0x01; // S changes: the signature no longer verifies
  const ownX25519 = await wc.x25519Generate();
  const aesRaw = wc.randomBytes(32);
  const aes = await wc.aesKey(aesRaw);
  const browserEnvelope = await wc.aesSealEnvelope(aes, 1, wc.utf8(browserText), associatedData);
  addLine("inputs", `Ed25519 key pair; signed "hello from the browser": public key ${short(wc.hex(signed.publicKey))}, ` +
    `signature ${short(wc.hex(signed.signature))}; a copy with one bit of S flipped`);
  addLine("inputs", `X25519 key pair (the peer): public key ${short(wc.hex(ownX25519.publicKey))}`);
  addLine("inputs", `AES-256-GCM key (random, imported below - a demo: real apps never send keys) and an ` +
    `envelope of "${browserText}" sealed with it (${browserEnvelope.length} bytes, associated data "web-example")`);

  // 2. Keys on the server, over Connect.
  let serverX25519Public: Uint8Array | undefined;
  let localShared: Uint8Array | undefined;
  try {
    const x = await lanes[0].api.services.keys.createKey({ keyId: x25519KeyId, type: KeyType.X25519 }, callOptions);
    results.keys.x25519 = x25519KeyId;
    serverX25519Public = x.versions[0]?.publicKey;
    if (!serverX25519Public || serverX25519Public.length !== 32) throw new Error("CreateKey returned no 32-byte public key");
    localShared = await wc.x25519Shared(ownX25519, serverX25519Public);
    results.setup.lines.push(`CreateKey ${x25519KeyId} (X25519): version ${x.currentVersion}, public key ${short(wc.hex(serverX25519Public))}`);
    addLine("setup", results.setup.lines.at(-1)!, "ok");
    const a = await lanes[0].api.services.keys.importKey({ keyId: aeadKeyId, type: KeyType.AES256_GCM, secret: aesRaw }, callOptions);
    results.keys.aead = aeadKeyId;
    if (a.currentVersion !== 1) throw new Error(`ImportKey: expected version 1, got ${a.currentVersion}`);
    results.setup.lines.push(`ImportKey ${aeadKeyId} (AES-256-GCM, the key above): version ${a.currentVersion}`);
    addLine("setup", results.setup.lines.at(-1)!, "ok");
    results.setup.ok = true;
  } catch (e) {
    results.setup.error = describeError(e);
    problems.push(`setup: ${results.setup.error}`);
    addLine("setup", `error (over Connect): ${results.setup.error}`, "bad");
  }

  // 3. The steps. `needsKeys`: skipped when the keys could not be made.
  const steps: { id: string; title: string; needsKeys: boolean; run: (lane: Lane) => Promise<Outcome> }[] = [
    {
      id: "verify",
      title: "Ed25519Service.Verify of the WebCrypto signature",
      needsKeys: false,
      run: async (lane) => {
        const r = await lane.api.verify(signed, callOptions);
        if (!r.valid) throw new Error("the server says the WebCrypto signature is invalid");
        return { value: `valid=${r.valid}`, memoHit: r.memoHit, shown: `valid: ${r.valid}` };
      },
    },
    {
      id: "verify-tampered",
      title: "Verify of the tampered signature (invalid answers are never remembered)",
      needsKeys: false,
      run: async (lane) => {
        const r = await lane.api.verify({ ...signed, signature: tampered }, callOptions);
        if (r.valid) throw new Error("the server accepts a tampered signature");
        return { value: `valid=${r.valid}`, memoHit: r.memoHit, shown: `valid: ${r.valid}` };
      },
    },
    {
      id: "derive",
      title: `X25519Service.Derive: ${x25519KeyId} with the browser's public key`,
      needsKeys: true,
      run: async (lane) => {
        const r = await lane.api.derive(
          { keyId: x25519KeyId, peerPublicKey: ownX25519.publicKey, output: DeriveOutput.RAW },
          callOptions,
        );
        if (!wc.equalBytes(r.sharedKey, localShared!)) throw new Error("the shared key differs from WebCrypto's");
        const h = wc.hex(r.sharedKey);
        return { value: h, memoHit: r.memoHit, shown: `shared key ${short(h)} = WebCrypto's` };
      },
    },
    {
      id: "open",
      title: "AeadService.Open of the envelope sealed in the browser",
      needsKeys: true,
      run: async (lane) => {
        const r = await lane.api.open({ keyId: aeadKeyId, envelope: browserEnvelope, associatedData }, callOptions);
        const text = new TextDecoder().decode(r.plaintext);
        if (text !== browserText) throw new Error(`opened to "${text}", expected "${browserText}"`);
        return { value: text, memoHit: r.memoHit, shown: `"${text}" (key version ${r.keyVersion})` };
      },
    },
    {
      id: "seal-open",
      title: "AeadService.Seal, then Open of that envelope (Seal recorded it: a memo hit) and WebCrypto's open",
      needsKeys: true,
      run: async (lane) => {
        const s = await lane.api.seal({ keyId: aeadKeyId, plaintext: wc.utf8(serverText), associatedData }, callOptions);
        const o = await lane.api.open({ keyId: aeadKeyId, envelope: s.envelope, associatedData }, callOptions);
        const text = new TextDecoder().decode(o.plaintext);
        if (text !== serverText) throw new Error(`opened to "${text}", expected "${serverText}"`);
        const local = await wc.aesOpenEnvelope(aes, s.envelope, associatedData);
        if (new TextDecoder().decode(local.plaintext) !== serverText || local.keyVersion !== s.keyVersion) {
          throw new Error("WebCrypto opened the envelope to something else");
        }
        return {
          value: text,
          memoHit: o.memoHit,
          shown: `sealed ${s.envelope.length} bytes, opened "${text}"; WebCrypto opened it too`,
        };
      },
    },
  ];

  const tbody = $("steps").querySelector("tbody")!;
  for (const step of steps) {
    const record: StepRecord = { id: step.id, title: step.title, cells: {}, equal: null };
    results.steps.push(record);
    const tr = document.createElement("tr");
    tr.dataset.step = step.id;
    const th = document.createElement("th");
    th.textContent = step.title;
    tr.append(th);
    tbody.append(tr);
    for (const lane of lanes) {
      const td = document.createElement("td");
      tr.append(td);
      let cell: Cell;
      if (step.needsKeys && !results.setup.ok) {
        cell = { ok: false, skipped: true, error: "skipped: no keys (setup failed)" };
      } else {
        try {
          cell = { ok: true, skipped: false, outcome: await step.run(lane) };
        } catch (e) {
          cell = { ok: false, skipped: false, error: describeError(e) };
          problems.push(`${step.id} over ${lane.label}: ${cell.error}`);
        }
      }
      record.cells[lane.id] = cell;
      renderCell(td, step.id, lane.id, cell);
    }
    const [a, b] = lanes.map((l) => record.cells[l.id]);
    const eq = document.createElement("td");
    eq.dataset.step = step.id;
    eq.dataset.equal = "n/a";
    eq.textContent = "-";
    if (a?.ok && b?.ok) {
      record.equal = a.outcome!.value === b.outcome!.value;
      eq.dataset.equal = String(record.equal);
      eq.textContent = record.equal ? "equal" : "DIFFERENT";
      eq.className = record.equal ? "ok" : "bad";
      if (!record.equal) problems.push(`${step.id}: Connect and gRPC-Web answers differ`);
    }
    tr.append(eq);
  }

  // 4. Clean-up, over gRPC-Web.
  results.cleanup.ok = true;
  for (const keyId of [results.keys.x25519, results.keys.aead]) {
    if (!keyId) continue;
    try {
      // Deletion is scheduled (the server's --key_deletion_wait); CancelKeyDeletion undoes it.
      const deleted = await lanes[1].api.services.keys.deleteKey({ keyId }, callOptions);
      const when = new Date(Number(deleted.deletionUnixSeconds) * 1000).toISOString();
      results.cleanup.lines.push(`DeleteKey ${keyId}: destroyed at ${when}`);
      addLine("cleanup", results.cleanup.lines.at(-1)!, "ok");
    } catch (e) {
      results.cleanup.ok = false;
      results.cleanup.error = describeError(e);
      problems.push(`cleanup: ${results.cleanup.error}`);
      addLine("cleanup", `DeleteKey ${keyId}: error ${results.cleanup.error}`, "bad");
    }
  }
  if (!results.keys.x25519 && !results.keys.aead) addLine("cleanup", "nothing to delete");

  setStatus(results, problems.length === 0 ? "done" : `error: ${problems[0]}` +
    (problems.length > 1 ? ` (and ${problems.length - 1} more)` : ""));
}

main().catch((e) => {
  const status = `error: ${describeError(e)}`;
  document.body.dataset.status = status;
  const el = document.getElementById("status");
  if (el) {
    el.textContent = status;
    el.className = "bad";
  }
});
