#!/usr/bin/env node
// The mobile resume (issue 32): a phone re-reads its 27 read-state blobs of ~55 KB on every
// resume. Measures, per resume, the requests the server finished, the bytes on the wire both ways
// and the wall time, for the TypeScript client (client/ts) with its open memo off and on, under
// Node and in headless Chromium (examples/web's page, ?scenario=bench).
//
//   node tests/bench/mobile_resume.mjs [--rounds 20] [--server build/bin/offload_server]
//                                      [--chromium /usr/bin/chromium] [--no-browser]
//
// One real offload_server on loopback (its CORS allowing the page's origin). Every byte between
// the clients and the server's HTTP port goes through a counting TCP relay on 127.0.0.1, so
// "bytes up / down" are what crossed the TCP connections (HTTP headers, framing and bodies; no
// TLS here). The blobs are sealed by another client straight to the gRPC port beforehand (so
// the server's memo holds them, as after a phone's previous session). Configurations:
//   memo off, batching off   27 Opens per resume (an app with no memo and no batching)
//   memo off, batching on    one BatchOpen of 27 per resume
//   memo on                  one BatchOpen the first resume, then nothing
// Printed: a Markdown table (median of rounds 2..N and the first round apart) and the load
// average. Needs `cmake --build build --target offload_server`, `npm ci` + `npm run build` in
// client/ts, and for Chromium examples/web and tests/e2e/web's node_modules.
import { createRequire } from "node:module";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer as createTcpServer, connect as tcpConnect } from "node:net";
import { loadavg, tmpdir } from "node:os";
import { execFileSync } from "node:child_process";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const arg = (name, fallback) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
};
const rounds = Number(arg("rounds", "20"));
process.env.OFFLOAD_SERVER = resolve(arg("server", join(repo, "build/bin/offload_server")));
const chromiumPath = arg("chromium", "/usr/bin/chromium");
const withBrowser = !process.argv.includes("--no-browser");

const { startServer } = await import(pathToFileURL(join(repo, "tests/e2e/connect/test/server.mjs")).href);
const client = await import(pathToFileURL(join(repo, "client/ts/dist/node.js")).href);
const { createOffloadClient, createNodeTransport, createFetchTransport, KeyType } = client;

// A TCP relay to `port` that counts the bytes each way.
async function relay(port) {
  const counts = { up: 0, down: 0, connections: 0 };
  const sockets = new Set();
  const server = createTcpServer((c) => {
    counts.connections++;
    const u = tcpConnect(port, "127.0.0.1");
    for (const s of [c, u]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
    }
    c.on("data", (d) => {
      counts.up += d.length;
      u.write(d);
    });
    u.on("data", (d) => {
      counts.down += d.length;
      c.write(d);
    });
    c.on("end", () => u.end());
    u.on("end", () => c.end());
    c.on("error", () => u.destroy());
    u.on("error", () => c.destroy());
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  // close() also cuts the connections a client keeps alive (a browser's pool would hold it open).
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    counts,
    close: () =>
      new Promise((r) => {
        server.close(r);
        for (const s of sockets) s.destroy();
      }),
  };
}

async function requestsFinished(server) {
  const text = await (await fetch(server.metrics)).text();
  let n = 0;
  for (const m of text.matchAll(/^offload_requests_total\{[^}]*service="offload\.v1\.AeadService"[^}]*\} (\S+)$/gm)) n += Number(m[1]);
  return n;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

const configs = [
  { name: "memo off, batching off", memo: false, batching: false },
  { name: "memo off, batching on", memo: false, batching: true },
  { name: "memo on (8 MiB, 10 min)", memo: true, batching: true },
];

const server = await startServer([]);
// Whatever ends this process, its servers go with it.
const servers = [server];
process.on("exit", () => {
  for (const s of servers) if (s.alive()) process.kill(s.pid, "SIGKILL");
});
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(1));
const rows = [];
// Per-round samples: { requests, up, down, ms } for round 1 and the median of the others.
function summarize(where, transport, config, samples) {
  console.error(`mobile_resume: ${where}, ${transport}, ${config.name}: ${samples.map((x) => `${x.ms.toFixed(1)} ms/${x.requests}`).join(" ")}`);
  const rest = samples.slice(1);
  rows.push({
    where,
    transport,
    config: config.name,
    first: samples[0],
    steady: {
      requests: median(rest.map((s) => s.requests)),
      up: median(rest.map((s) => s.up)),
      down: median(rest.map((s) => s.down)),
      ms: median(rest.map((s) => s.ms)),
      p90: [...rest.map((s) => s.ms)].sort((a, b) => a - b)[Math.floor(rest.length * 0.9)],
    },
  });
}

const admin = createOffloadClient({ transport: createNodeTransport({ baseUrl: server.grpc, protocol: "grpc" }), memo: { verify: false } });
async function sealBlobs(keyId) {
  await admin.services.keys.createKey({ keyId, type: KeyType.XCHACHA20_POLY1305 });
  return Promise.all(
    Array.from({ length: 27 }, async (_, i) => {
      const plaintext = new Uint8Array(54000 + ((i * 977) % 2001));
      (await import("node:crypto")).randomFillSync(plaintext);
      const associatedData = new TextEncoder().encode(`user-42/blob-${i}`);
      const { envelope } = await admin.seal({ keyId, plaintext, associatedData });
      return { keyId, envelope, associatedData, plaintext };
    }),
  );
}

// ---- Node ----------------------------------------------------------------------------------
const nodeTransports = {
  "Connect, fetch (HTTP/1.1)": (url) => createFetchTransport({ baseUrl: url }),
  "Connect, node:http2": (url) => createNodeTransport({ baseUrl: url, httpVersion: "2" }),
};
let serial = 0;
for (const [tname, make] of Object.entries(nodeTransports)) {
  for (const config of configs) {
    const blobs = await sealBlobs(`bench-node-${++serial}`);
    const r = await relay(server.httpPort);
    const phone = createOffloadClient({
      transport: make(r.url),
      batching: config.batching,
      memo: config.memo ? { open: { maxAgeMs: 10 * 60_000 } } : { verify: false },
    });
    const samples = [];
    for (let i = 0; i < rounds; i++) {
      const before = { ...r.counts, requests: await requestsFinished(server) };
      const t0 = performance.now();
      const opened = await Promise.all(blobs.map((b) => phone.open(b)));
      const ms = performance.now() - t0;
      if (!opened.every((o, j) => Buffer.from(o.plaintext).equals(Buffer.from(blobs[j].plaintext)))) throw new Error("wrong plaintext");
      samples.push({ ms, up: r.counts.up - before.up, down: r.counts.down - before.down, requests: (await requestsFinished(server)) - before.requests });
    }
    summarize("Node " + process.version, tname, config, samples);
    await r.close();
  }
}

// ---- Chromium -------------------------------------------------------------------------------
if (withBrowser) {
  const site = mkdtempSync(join(tmpdir(), "offload-bench-site-"));
  execFileSync(process.execPath, [join(repo, "examples/web/build.mjs"), `--out=${site}`], { stdio: "ignore" });
  const { serveStatic } = await import(pathToFileURL(join(repo, "examples/web/serve.mjs")).href);
  const { chromium } = createRequire(join(repo, "tests/e2e/web/package.json"))("playwright-core");
  const static_ = await serveStatic(site);
  // A server whose CORS allows this origin (the relay passes Origin through).
  const webServer = await startServer([`--http_cors_origins=${static_.url}`]);
  servers.push(webServer);
  const profile = mkdtempSync(join(tmpdir(), "offload-bench-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-sync"],
  });
  let version = "";
  try {
    for (const config of configs) {
      const r = await relay(webServer.httpPort);
      const page = await context.newPage();
      await page.goto(`${static_.url}/?server=${encodeURIComponent(r.url)}&scenario=bench` +
        `&memo=${config.memo ? "on" : "off"}&batching=${config.batching ? "on" : "off"}`);
      await page.waitForFunction(() => document.body.dataset.status === "done" || (document.body.dataset.status ?? "").startsWith("error"),
        null, { timeout: 120_000 });
      const status = await page.locator("body").getAttribute("data-status");
      if (status !== "done") throw new Error(`the page says ${status}`);
      version ||= await page.evaluate(() => navigator.userAgent.match(/Chrome\/[\d.]+/)?.[0] ?? "");
      const samples = [];
      for (let i = 0; i < rounds; i++) {
        const before = { ...r.counts, requests: await requestsFinished(webServer) };
        const round = await page.evaluate(() => window.offloadBenchRound());
        samples.push({ ms: round.ms, up: r.counts.up - before.up, down: r.counts.down - before.down,
          requests: (await requestsFinished(webServer)) - before.requests });
      }
      summarize(`Chromium ${version.replace("Chrome/", "")}`, "Connect, fetch", config, samples);
      await page.close();
      await r.close();
    }
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
    rmSync(site, { recursive: true, force: true });
    await static_.close();
    await webServer.stop();
  }
}
await server.stop();

const kb = (n) => (n / 1000).toFixed(1);
console.log(`mobile resume: 27 blobs of 54,000-56,000 bytes, ${rounds} resumes per row; ` +
  `load average ${loadavg().map((x) => x.toFixed(2)).join(" ")} at the end, ${process.env.OFFLOAD_SERVER}`);
console.log("");
console.log("| client | transport | configuration | requests / resume (first; then) | KB up / resume (first; then) | KB down / resume (first; then) | ms / resume (first; then median, p90) |");
console.log("|---|---|---|---|---|---|---|");
for (const r of rows) {
  console.log(`| ${r.where} | ${r.transport} | ${r.config} | ${r.first.requests}; ${r.steady.requests} | ` +
    `${kb(r.first.up)}; ${kb(r.steady.up)} | ${kb(r.first.down)}; ${kb(r.steady.down)} | ` +
    `${r.first.ms.toFixed(1)}; ${r.steady.ms.toFixed(1)}, ${r.steady.p90.toFixed(1)} |`);
}
