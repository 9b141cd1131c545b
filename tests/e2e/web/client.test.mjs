// The TypeScript client (client/ts) in a real browser: examples/web's page with ?scenario=NAME
// runs one of the client's memo scenarios (examples/web/src/client-demo.ts) in Debian's headless
// Chromium against a real offload_server on another loopback origin. Each page load is counted
// at the server (offload_requests_total from /metrics): the page's own checks (window
// offloadClientResults) and the server's exact counts must both hold.
//   resume (Connect and gRPC-Web), lru, tampered, disabled, expiry, batching: an anonymous server;
//   token: a server that wants EdDSA tokens, handed out by this test from the page's origin
//   (GET /token): the phone's first one has expired.
// Environment: as web.test.mjs (OFFLOAD_SERVER, OFFLOAD_PROTOC, OFFLOAD_PROTO_DIR,
// OFFLOAD_WEB_OUT, OFFLOAD_CHROMIUM, OFFLOAD_WEB_VERBOSE).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { generateKeyPairSync, randomBytes, sign } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { startServer } from "../connect/test/server.mjs";
import { serveStatic } from "../../../examples/web/serve.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../..");
process.env.OFFLOAD_SERVER ??= join(repo, "build/bin/offload_server");
const outDir = resolve(process.env.OFFLOAD_WEB_OUT ?? mkdtempSync(join(tmpdir(), "offload-web-client-")));
const siteDir = join(outDir, "client-site");
const chromiumPath = process.env.OFFLOAD_CHROMIUM ?? "/usr/bin/chromium";
const OVERALL_MS = 250_000;
const LAUNCH_MS = 90_000;
const PAGE_MS = 60_000;

let site;
let context;
let userDataDir;
const diagnostics = [];
const tokenLog = []; // "phone:false", "phone:true", "admin:false", ...
let tokenFor = () => ""; // set by the token test

function browserPids() {
  if (!userDataDir) return [];
  return readdirSync("/proc").filter((e) => /^\d+$/.test(e)).filter((e) => {
    try {
      return readFileSync(`/proc/${e}/cmdline`, "latin1").includes(userDataDir);
    } catch {
      return false;
    }
  }).map(Number);
}
function killBrowserNow() {
  const pids = browserPids();
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
  return pids.length;
}
const watchdog = setTimeout(() => {
  console.error(`client.test: still running after ${OVERALL_MS / 1000} s\n${diagnostics.join("\n")}`);
  process.exit(1);
}, OVERALL_MS);
watchdog.unref();
process.on("exit", () => killBrowserNow());

// RPCs the server finished: "Service/Method CODE" -> count.
async function requestCounts(server) {
  const text = await (await fetch(server.metrics)).text();
  const counts = {};
  for (const m of text.matchAll(/^offload_requests_total\{([^}]*)\} (\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Number(m[2]) > 0) counts[`${labels.service.replace(/^offload\.v1\./, "")}/${labels.method} ${labels.code}`] = Number(m[2]);
  }
  return counts;
}
async function assertCountsSince(server, before, expected, what) {
  let delta;
  for (const until = Date.now() + 5000; ; await new Promise((r) => setTimeout(r, 50))) {
    const now = await requestCounts(server);
    delta = {};
    for (const [k, v] of Object.entries(now)) if (v !== (before[k] ?? 0)) delta[k] = v - (before[k] ?? 0);
    try {
      assert.deepEqual(delta, expected);
      return;
    } catch (e) {
      if (Date.now() > until) throw new assert.AssertionError({ message: `${what}: ${e.message}`, actual: delta, expected });
    }
  }
}

// Opens the page with ?scenario= and waits for its outcome; returns the scenario's result.
async function runScenario(server, scenario, protocol = "connect") {
  const page = await context.newPage();
  const label = `${scenario}/${protocol}`;
  page.on("console", (m) => diagnostics.push(`[${label}] console.${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => diagnostics.push(`[${label}] page error: ${e.message}`));
  const url = `${site.url}/?server=${encodeURIComponent(server.http)}&scenario=${scenario}&protocol=${protocol}`;
  try {
    await page.goto(url, { waitUntil: "load", timeout: PAGE_MS });
    await page.waitForFunction(
      () => document.body.dataset.status === "done" || (document.body.dataset.status ?? "").startsWith("error"),
      null,
      { timeout: PAGE_MS },
    );
    const status = await page.locator("body").getAttribute("data-status");
    const results = await page.evaluate(() => window.offloadClientResults);
    assert.equal(status, "done", `${label}: the page says ${status}`);
    assert.equal(results.scenarios.length, 1);
    const r = results.scenarios[0];
    assert.equal(r.name, scenario);
    assert.ok(r.ok, `${label}: ${r.error}`);
    assert.equal(await page.locator(`li[data-scenario="${scenario}"]`).getAttribute("class"), "ok");
    return r;
  } catch (e) {
    console.error(`--- browser ---\n${diagnostics.filter((l) => l.startsWith(`[${label}]`)).join("\n")}\n--- server ---\n${server.log()}`);
    throw e;
  } finally {
    await page.close();
  }
}

const setup = { "KeyService/CreateKey OK": 1, "AeadService/BatchSeal OK": 1, "KeyService/DeleteKey OK": 1 };

describe("the TypeScript client in headless Chromium (examples/web ?scenario=)", () => {
  let server;
  before(async () => {
    execFileSync(process.execPath, [join(repo, "examples/web/build.mjs"), `--out=${siteDir}`], { stdio: "inherit" });
    site = await serveStatic(siteDir, 0, {
      routes: {
        "/token": (url, res) => {
          const who = url.searchParams.get("for");
          const refresh = url.searchParams.get("refresh");
          tokenLog.push(`${who}:${refresh}`);
          res.writeHead(200, { "Content-Type": "text/plain", "Cache-Control": "no-store" }).end(tokenFor(who, refresh === "true"));
        },
      },
    });
    for (let attempt = 1; ; ++attempt) {
      userDataDir = mkdtempSync(join(tmpdir(), "offload-web-client-chromium-"));
      try {
        context = await chromium.launchPersistentContext(userDataDir, {
          executablePath: chromiumPath,
          headless: true,
          args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"],
          timeout: LAUNCH_MS,
        });
        break;
      } catch (e) {
        killBrowserNow();
        rmSync(userDataDir, { recursive: true, force: true });
        userDataDir = undefined;
        if (attempt >= 2) throw e;
        console.error(`client.test: Chromium did not start (${e.message.split("\n")[0]}); once more`);
      }
    }
    server = await startServer([`--http_cors_origins=${site.url}`]);
  });

  after(async () => {
    if (server) assert.equal((await server.stop()).code, 0);
    if (context) await Promise.race([context.close().catch(() => {}), new Promise((r) => setTimeout(r, 10_000).unref())]);
    if (process.env.OFFLOAD_WEB_VERBOSE) console.log(diagnostics.join("\n"));
    killBrowserNow();
    if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
    await site?.close();
    if (!process.env.OFFLOAD_WEB_OUT) rmSync(outDir, { recursive: true, force: true });
  });

  for (const protocol of ["connect", "grpc-web"]) {
    it(`resume over ${protocol}: 27 blobs of 54-56 KB, one BatchOpen the first time, no request the second`, async () => {
      const before = await requestCounts(server);
      const r = await runScenario(server, "resume", protocol);
      assert.deepEqual([r.data.first.requests, r.data.first.local, r.data.second.requests, r.data.second.local], [1, 0, 0, 27]);
      assert.equal(r.data.stats.hits, 27);
      assert.ok(r.data.bytes > 27 * 54000 && r.data.bytes <= 27 * 56000);
      assert.ok(r.data.stats.bytesNotReceived === r.data.bytes);
      await assertCountsSince(server, before, { ...setup, "AeadService/BatchOpen OK": 1 }, "resume");
    });
  }

  it("lru: live blobs re-read between new ones stay under a byte bound smaller than the set", async () => {
    const before = await requestCounts(server);
    const r = await runScenario(server, "lru");
    assert.equal(r.data.liveLocal, 60);
    assert.ok(r.data.stats.bytes <= r.data.maxBytes && r.data.stats.evictions > 0);
    await assertCountsSince(server, before, { ...setup, "AeadService/BatchSeal OK": 2, "AeadService/Open OK": 23 }, "lru");
  });

  it("tampered: fails every time, never remembered", async () => {
    const before = await requestCounts(server);
    const r = await runScenario(server, "tampered");
    assert.deepEqual(r.data.codes, ["InvalidArgument", "InvalidArgument", "InvalidArgument"]);
    await assertCountsSince(server, before, {
      ...setup,
      "AeadService/Open OK": 1,
      "AeadService/Open INVALID_ARGUMENT": 3,
      "AeadService/BatchOpen OK": 1,
    }, "tampered");
  });

  it("disabled: the key's entries go on the first refusal", async () => {
    const before = await requestCounts(server);
    const r = await runScenario(server, "disabled");
    assert.equal(r.data.dropped, 4);
    await assertCountsSince(server, before, {
      ...setup,
      "AeadService/BatchOpen OK": 1,
      "KeyService/DisableKey OK": 1,
      "AeadService/Open FAILED_PRECONDITION": 5,
    }, "disabled");
  });

  it("expiry: ... and after the maximum age", async () => {
    const before = await requestCounts(server);
    const r = await runScenario(server, "expiry");
    assert.deepEqual([r.data.within, r.data.stats.expired], [3, 3]);
    await assertCountsSince(server, before, { ...setup, "AeadService/BatchOpen OK": 2, "KeyService/DisableKey OK": 1 }, "expiry");
  });

  it("batching: 27 concurrent opens are one BatchOpen, each caller its own answer", async () => {
    const before = await requestCounts(server);
    const r = await runScenario(server, "batching");
    assert.equal(r.data.answers.filter((a) => a === "OK").length, 26);
    assert.equal(r.data.answers[13], "InvalidArgument");
    await assertCountsSince(server, before, { ...setup, "AeadService/BatchOpen OK": 1 }, "batching");
  });

  it("token: refreshed once on UNAUTHENTICATED", async () => {
    const dir = mkdtempSync(join(tmpdir(), "offload-web-client-auth-"));
    const { publicKey, privateKey } = generateKeyPairSync("ed25519");
    writeFileSync(join(dir, "jwks.json"), JSON.stringify({ keys: [{ ...publicKey.export({ format: "jwk" }), kid: "web-2" }] }));
    writeFileSync(join(dir, "policy.json"), JSON.stringify({ admins: ["web-admin"], grants: [{ client: "web-*", keys: ["web-*"], operations: ["*"] }] }));
    const b64 = (x) => Buffer.from(x).toString("base64url");
    const mint = (sub, expired) => {
      const exp = Math.floor(Date.now() / 1000) + (expired ? -3600 : 600);
      const input = `${b64(JSON.stringify({ alg: "EdDSA", typ: "JWT", kid: "web-2" }))}.` +
        b64(JSON.stringify({ iss: "https://id.web.test", aud: "crypto-offload", sub, exp, jti: randomBytes(4).toString("hex") }));
      return `${input}.${b64(sign(null, Buffer.from(input), privateKey))}`;
    };
    // The phone's first token has expired; a refresh gets a good one. The admin's is good.
    tokenFor = (who, refresh) => (who === "admin" ? mint("web-admin", false) : mint("web-phone", !refresh));
    tokenLog.length = 0;
    const authServer = await startServer([
      `--http_cors_origins=${site.url}`, `--jwks_file=${join(dir, "jwks.json")}`, "--token_issuer=https://id.web.test",
      "--token_audience=crypto-offload", `--policy_file=${join(dir, "policy.json")}`, "--require_identity",
    ]);
    try {
      const before = await requestCounts(authServer);
      const r = await runScenario(authServer, "token");
      assert.equal(r.data.opened, 27);
      assert.deepEqual(tokenLog.filter((l) => l.startsWith("phone")), ["phone:false", "phone:true"]);
      assert.deepEqual(tokenLog.filter((l) => l.startsWith("admin")), ["admin:false"]);
      await assertCountsSince(authServer, before, {
        ...setup,
        "AeadService/BatchOpen UNAUTHENTICATED": 1,
        "AeadService/BatchOpen OK": 1,
      }, "token");
    } finally {
      assert.equal((await authServer.stop()).code, 0);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
