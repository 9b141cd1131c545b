// examples/web in a real browser: the page is built (protoc-gen-es + esbuild, and tsc checks it),
// served from one loopback origin (examples/web/serve.mjs on 127.0.0.1:A), and driven in Debian's
// headless Chromium (playwright-core, never a downloaded browser) against a real offload_server
// whose HTTP port is another origin (127.0.0.1:B).
//   1. A in --http_cors_origins: the page completes; every answer is checked on the page (both
//      transports, memo_hit of each call, equal answers) and against the server's request counts.
//      A screenshot is written (OFFLOAD_WEB_SCREENSHOT, else OFFLOAD_WEB_OUT/screenshot.png).
//   2. A not in the list: the browser refuses every call, the page shows errors, and the server
//      ran no RPC at all (the preflight was refused, so no POST was sent).
//   3. A server that requires identities (--jwks_file, --require_identity, a policy): the page
//      given a bearer token (#token=, an EdDSA JWT made here with node:crypto) completes; the page
//      without one is refused `unauthenticated` (no key is made, every call refused).
// Environment:
//   OFFLOAD_SERVER          offload_server binary (default ../../../build/bin/offload_server)
//   OFFLOAD_PROTOC          protoc (default: protoc on PATH); OFFLOAD_PROTO_DIR: proto/ folder
//   OFFLOAD_WEB_OUT         folder for the built site and the screenshot (default: a temp dir)
//   OFFLOAD_WEB_SCREENSHOT  where the PNG goes (`npm run screenshot`: examples/web/screenshot.png)
//   OFFLOAD_CHROMIUM        the browser (default /usr/bin/chromium)
//   OFFLOAD_WEB_VERBOSE     set: print the browser's console and failed requests at the end
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { generateKeyPairSync, sign } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { startServer } from "../connect/test/server.mjs";
import { serveStatic } from "../../../examples/web/serve.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../..");
const example = join(repo, "examples/web");
process.env.OFFLOAD_SERVER ??= join(repo, "build/bin/offload_server");
const outDir = resolve(process.env.OFFLOAD_WEB_OUT ?? mkdtempSync(join(tmpdir(), "offload-web-")));
const siteDir = join(outDir, "site");
const screenshotPath = resolve(process.env.OFFLOAD_WEB_SCREENSHOT ?? join(outDir, "screenshot.png"));
const chromiumPath = process.env.OFFLOAD_CHROMIUM ?? "/usr/bin/chromium";

const OVERALL_MS = 250_000; // the whole file, browser start to browser kill (a normal run: ~15 s)
// Chromium's start: ~1 s on a quiet machine, but a CI run whose first minute also starts
// PostgreSQL, kind and ASan servers on the same 2 cores once took more than 30 s. One retry, with a
// fresh profile, for a start that hangs.
const LAUNCH_MS = 90_000;
const PAGE_MS = 30_000; // one page load until data-status is "done" or "error: ..."

// What the page must show. memo_hit per [Connect (1st call), gRPC-Web (2nd call)].
const EXPECTED = {
  verify: { value: "valid=true", memo: [false, true] },
  "verify-tampered": { value: "valid=false", memo: [false, false] },
  derive: { value: /^[0-9a-f]{64}$/, memo: [false, true] },
  open: { value: "a blob sealed in the browser by WebCrypto", memo: [false, true] },
  "seal-open": { value: "a blob sealed by the server", memo: [true, true] },
};
const LANES = ["connect", "grpc-web"];

let site; // the static server
let context; // the Chromium (persistent context on a fresh user-data-dir)
let userDataDir;
const diagnostics = []; // the browser's console, page errors and failed requests, printed on failure

function note(line) {
  diagnostics.push(line);
}

// Chromium processes still running from our user-data-dir (the browser and its helpers).
function browserPids() {
  if (!userDataDir) return [];
  const pids = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "latin1").includes(userDataDir)) pids.push(Number(entry));
    } catch {
      // gone already
    }
  }
  return pids;
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

// This process's own children (the offload_servers and the browser) that are still running.
function childPids() {
  const pids = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "latin1");
      if (Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === process.pid) pids.push(Number(entry));
    } catch {
      // gone already
    }
  }
  return pids;
}

// A fixed overall timeout: whatever hangs (the browser, a page, the server), the run ends, the
// browser and the servers are killed and what the browser logged is printed.
const watchdog = setTimeout(() => {
  console.error(`web.test: still running after ${OVERALL_MS / 1000} s; killing the browser and the servers`);
  console.error(diagnostics.join("\n"));
  process.exit(1); // the exit handler below kills them
}, OVERALL_MS);
watchdog.unref();
process.on("exit", () => {
  killBrowserNow();
  for (const pid of childPids()) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone already
    }
  }
});

// Starts offload_server allowing exactly `origins` (--http_cors_origins).
function startWithOrigins(origins) {
  return startServer([`--http_cors_origins=${origins.join(",")}`]);
}

// RPCs the server finished, from its Prometheus text: "Service/Method code" -> count.
async function requestCounts(server) {
  const text = await (await fetch(server.metrics)).text();
  const counts = {};
  for (const m of text.matchAll(/^offload_requests_total\{([^}]*)\} (\S+)$/gm)) {
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    const n = Number(m[2]);
    if (n > 0) counts[`${labels.service.replace(/^offload\.v1\./, "")}/${labels.method} ${labels.code}`] = n;
  }
  return counts;
}

// Ids of the server's keys that are not scheduled for deletion, asked over Connect JSON from
// Node (no Origin: not a browser call).
async function keyIds(server) {
  const r = await fetch(`${server.http}/offload.v1.KeyService/ListKeys`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: "{}",
  });
  assert.equal(r.status, 200, `ListKeys: HTTP ${r.status}`);
  return ((await r.json()).keys ?? [])
    .filter((k) => k.state !== "KEY_STATE_PENDING_DELETION")
    .map((k) => k.keyId);
}

// Opens the page against `server` and waits for its outcome. Returns the page and its results.
async function runPage(server, label, fragment = "") {
  const page = await context.newPage();
  page.on("console", (m) => note(`[${label}] console.${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => note(`[${label}] page error: ${e.message}`));
  page.on("requestfailed", (r) => note(`[${label}] request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  const url = `${site.url}/?server=${encodeURIComponent(server.http)}`;
  note(`[${label}] open ${url}${fragment ? " (with a fragment)" : ""}`);
  await page.goto(url + fragment, { waitUntil: "load", timeout: PAGE_MS });
  await page.waitForFunction(
    () => document.body.dataset.status === "done" || (document.body.dataset.status ?? "").startsWith("error"),
    null,
    { timeout: PAGE_MS },
  );
  const status = await page.locator("body").getAttribute("data-status");
  const results = await page.evaluate(() => window.offloadResults);
  note(`[${label}] status: ${status}`);
  return { page, status, results };
}

async function cell(page, step, lane) {
  const td = page.locator(`td[data-step="${step}"][data-transport="${lane}"]`);
  return {
    ok: await td.getAttribute("data-ok"),
    memoHit: await td.getAttribute("data-memo-hit"),
    text: await td.innerText(),
  };
}

// On failure: what the browser and the server said.
async function explained(server, body) {
  const from = diagnostics.length;
  try {
    await body(from);
  } catch (e) {
    console.error(`--- browser (console, page errors, failed requests) ---\n${diagnostics.slice(from).join("\n")}`);
    if (server) console.error(`--- offload_server log ---\n${server.log()}`);
    throw e;
  }
}

function launchChromium(userDataDir) {
  return chromium.launchPersistentContext(userDataDir, {
    executablePath: chromiumPath,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
    viewport: { width: 1280, height: 900 },
    timeout: LAUNCH_MS,
  });
}

describe("examples/web in headless Chromium", () => {
  before(async () => {
    execFileSync(process.execPath, [join(example, "build.mjs"), `--out=${siteDir}`], { stdio: "inherit" });
    execFileSync(process.execPath, [join(example, "node_modules/typescript/bin/tsc"), "-p", example], {
      stdio: "inherit",
    });
    site = await serveStatic(siteDir);
    for (let attempt = 1; ; ++attempt) {
      userDataDir = mkdtempSync(join(tmpdir(), "offload-web-chromium-"));
      try {
        context = await launchChromium(userDataDir);
        break;
      } catch (e) {
        const stray = killBrowserNow();
        rmSync(userDataDir, { recursive: true, force: true });
        userDataDir = undefined;
        if (attempt >= 2) throw e;
        console.error(`web.test: Chromium did not start (${e.message.split("\n")[0]}); ` +
                      `killed ${stray} processes, starting it once more`);
      }
    }
    console.log(`web.test: page served at ${site.url}, Chromium ${context.browser()?.version() ?? "(persistent)"}`);
  });

  after(async () => {
    if (context) {
      let timer;
      await Promise.race([
        context.close().catch(() => {}),
        new Promise((r) => (timer = setTimeout(r, 10_000))),
      ]);
      clearTimeout(timer);
    }
    if (process.env.OFFLOAD_WEB_VERBOSE) console.log(diagnostics.join("\n"));
    const stray = killBrowserNow();
    if (stray > 0) console.error(`web.test: killed ${stray} Chromium processes left after close`);
    if (userDataDir) rmSync(userDataDir, { recursive: true, force: true });
    await site?.close();
    if (!process.env.OFFLOAD_WEB_OUT) rmSync(siteDir, { recursive: true, force: true });
  });

  it("completes when its origin is allowed: both transports, equal answers, memo hits", async () => {
    const server = await startWithOrigins(["https://app.example.com", site.url]);
    let stopped;
    try {
      await explained(server, async () => {
        const { page, status, results } = await runPage(server, "allowed");
        assert.equal(status, "done", `the page says: ${status}`);
        assert.equal(await page.locator("#status").innerText(), "done");
        assert.equal(results.origin, site.url);
        assert.equal(results.server, server.http);
        assert.ok(results.setup.ok && results.cleanup.ok);
        assert.match(results.keys.x25519, /^web-x25519-[0-9a-f]{8}$/);
        assert.match(results.keys.aead, /^web-aes-[0-9a-f]{8}$/);

        assert.deepEqual(results.steps.map((s) => s.id), Object.keys(EXPECTED));
        for (const step of results.steps) {
          const want = EXPECTED[step.id];
          for (const [i, lane] of LANES.entries()) {
            const c = step.cells[lane];
            assert.ok(c.ok, `${step.id} over ${lane}: ${c.error}`);
            if (want.value instanceof RegExp) assert.match(c.outcome.value, want.value);
            else assert.equal(c.outcome.value, want.value, `${step.id} over ${lane}`);
            assert.equal(c.outcome.memoHit, want.memo[i], `${step.id} over ${lane}: memo_hit`);
            // ... and the page shows it.
            const shown = await cell(page, step.id, lane);
            assert.equal(shown.ok, "true");
            assert.equal(shown.memoHit, String(want.memo[i]), `${step.id} over ${lane}: data-memo-hit`);
            assert.ok(shown.text.includes(`memo_hit: ${want.memo[i]}`), `${step.id} over ${lane} shows: ${shown.text}`);
          }
          assert.equal(step.cells.connect.outcome.value, step.cells["grpc-web"].outcome.value, step.id);
          assert.equal(step.equal, true, step.id);
          assert.equal(
            await page.locator(`td[data-step="${step.id}"][data-equal]`).getAttribute("data-equal"),
            "true",
          );
        }

        // The server did exactly these calls (over both transports), and the page's keys are
        // scheduled for deletion.
        assert.deepEqual(await requestCounts(server), {
          "KeyService/CreateKey OK": 1,
          "KeyService/ImportKey OK": 1,
          "Ed25519Service/Verify OK": 4,
          "X25519Service/Derive OK": 2,
          "AeadService/Open OK": 4,
          "AeadService/Seal OK": 2,
          "KeyService/DeleteKey OK": 2,
        });
        assert.deepEqual(await keyIds(server), []);

        mkdirSync(dirname(screenshotPath), { recursive: true });
        await page.screenshot({ path: screenshotPath, fullPage: true });
        console.log(`web.test: screenshot ${screenshotPath}`);
        await page.close();
      });
    } finally {
      stopped = await server.stop();
    }
    assert.equal(stopped.code, 0, "offload_server's exit code after SIGTERM");
  });

  it("is refused by the browser when its origin is not allowed", async () => {
    // The same host with another port, and another host with the same port: exact matches only.
    const otherPort = new URL(site.url).port === "1" ? 2 : 1;
    const server = await startWithOrigins([`http://localhost:${new URL(site.url).port}`, `http://127.0.0.1:${otherPort}`]);
    let stopped;
    try {
      await explained(server, async (from) => {
        const { page, status, results } = await runPage(server, "refused");
        assert.match(status, /^error: setup: .*Failed to fetch/, `the page says: ${status}`);
        assert.match(await page.locator("#status").innerText(), /^error: /);
        assert.equal(results.setup.ok, false);
        assert.match(await page.locator("#setup").innerText(), /error \(over Connect\): \[unavailable\] the server was not reached: Failed to fetch/);
        for (const step of results.steps) {
          for (const lane of LANES) {
            const c = step.cells[lane];
            assert.equal(c.ok, false, `${step.id} over ${lane} should have failed`);
            const shown = await cell(page, step.id, lane);
            assert.equal(shown.ok, "false");
            assert.equal(shown.memoHit, null);
            if (["verify", "verify-tampered"].includes(step.id)) {
              // Needs no key: sent, and refused by the browser.
              assert.equal(c.skipped, false);
              assert.match(shown.text, /^error: \[unavailable\] the server was not reached: Failed to fetch/);
            } else {
              assert.equal(c.skipped, true);
            }
          }
        }
        // Chromium says why: a CORS refusal for each of the 5 calls (CreateKey, 2 x 2 verifies).
        const refusals = diagnostics.slice(from).filter((l) => /blocked by CORS policy/.test(l));
        assert.ok(refusals.length >= 5, `expected >= 5 CORS refusals in the console, got:\n${diagnostics.slice(from).join("\n")}`);
        // Strict CORS: the preflight got no Access-Control-Allow-*, so the browser sent no POST
        // and no RPC reached the server.
        for (const line of refusals) assert.match(line, /preflight/, line);
        assert.deepEqual(await requestCounts(server), {});
        assert.deepEqual(await keyIds(server), []);
        await page.close();
      });
    } finally {
      stopped = await server.stop();
    }
    assert.equal(stopped.code, 0, "offload_server's exit code after SIGTERM");
  });

  it("sends a bearer token where the server requires identities", async () => {
    // The issuer's key, its JWKS, and a token for the identity the policy names.
    const dir = mkdtempSync(join(tmpdir(), "offload-web-auth-"));
    const { publicKey, privateKey } = generateKeyPairSync("ed25519");
    const jwks = join(dir, "jwks.json");
    writeFileSync(jwks, JSON.stringify({ keys: [{ ...publicKey.export({ format: "jwk" }), kid: "web-1" }] }));
    const policy = join(dir, "policy.json");
    writeFileSync(policy, JSON.stringify({
      admins: ["web-demo"],
      grants: [{ client: "web-demo", keys: ["web-*"], operations: ["*"] }],
    }));
    const b64 = (x) => Buffer.from(x).toString("base64url");
    const now = Math.floor(Date.now() / 1000);
    const input = `${b64(JSON.stringify({ alg: "EdDSA", typ: "JWT", kid: "web-1" }))}.` +
      b64(JSON.stringify({ iss: "https://id.web.test", aud: "crypto-offload", sub: "web-demo", exp: now + 600 }));
    const token = `${input}.${b64(sign(null, Buffer.from(input), privateKey))}`;
    const server = await startServer([
      `--http_cors_origins=${site.url}`, `--jwks_file=${jwks}`, "--token_issuer=https://id.web.test",
      "--token_audience=crypto-offload", `--policy_file=${policy}`, "--require_identity",
    ]);
    let stopped;
    try {
      await explained(server, async () => {
        const anonymous = await runPage(server, "no token");
        assert.match(anonymous.status, /^error: setup: .*unauthenticated/i, `the page says: ${anonymous.status}`);
        assert.equal(anonymous.results.bearerToken, false);
        await anonymous.page.close();
        // Setup stopped at CreateKey; the verifies (which need no key) were tried and refused too.
        assert.deepEqual(await requestCounts(server), {
          "KeyService/CreateKey UNAUTHENTICATED": 1,
          "Ed25519Service/Verify UNAUTHENTICATED": 4,
        });

        const { page, status, results } = await runPage(server, "token", `#token=${token}`);
        assert.equal(status, "done", `the page says: ${status}`);
        assert.equal(results.bearerToken, true);
        assert.ok(results.setup.ok && results.cleanup.ok);
        for (const step of results.steps) {
          for (const lane of LANES) assert.ok(step.cells[lane].ok, `${step.id} over ${lane}: ${step.cells[lane].error}`);
        }
        assert.equal(await page.locator("#identity").innerText(), "a bearer token (from #token=)");
        assert.ok(!(await page.content()).includes(token), "the page shows the token");
        await page.close();
      });
      assert.ok(!server.log().includes(token.split(".")[1]), "the server logged the token");
    } finally {
      stopped = await server.stop();
      rmSync(dir, { recursive: true, force: true });
    }
    assert.equal(stopped.code, 0, "offload_server's exit code after SIGTERM");
  });
});
