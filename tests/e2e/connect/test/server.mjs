// Starts a real offload_server for a test: free loopback ports for gRPC, HTTP and metrics, a
// temporary data folder, a random key-encryption key in OFFLOAD_KEK. stop() sends SIGTERM and
// returns the exit code.
//   OFFLOAD_SERVER             path of the offload_server binary (required)
//   OFFLOAD_SERVER_EXTRA_ARGS  extra flags, split on spaces
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { get as httpGet } from "node:http";
import { get as httpsGet } from "node:https";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// `scheme` https: the server was given TLS flags; `ca` is its certificate, for the readiness probe.
// GET /readyz over HTTP or HTTPS (trusting `ca`): the status code.
function readyStatus(scheme, port, ca) {
  const get = scheme === "https" ? httpsGet : httpGet;
  return new Promise((resolve, reject) => {
    const req = get({ host: "127.0.0.1", port, path: "/readyz", ca, agent: false }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
    });
    req.on("error", reject);
  });
}

// Its ports are free when picked, not reserved: a test running beside this one may take one first,
// and the server then exits with "cannot listen on". Then: fresh ports, 3 starts in all.
export async function startServer(extraArgs = [], { scheme = "http", ca } = {}) {
  for (let attempt = 1; ; ++attempt) {
    try {
      return await startOnce(extraArgs, scheme, ca);
    } catch (e) {
      if (attempt >= 3 || !String(e.message).includes("cannot listen on")) throw e;
      console.error(`startServer: a port was taken (attempt ${attempt}), trying fresh ports`);
    }
  }
}

async function startOnce(extraArgs, scheme, ca) {
  const binary = process.env.OFFLOAD_SERVER;
  if (!binary) throw new Error("OFFLOAD_SERVER (the offload_server binary) is not set");
  const dataDir = mkdtempSync(join(tmpdir(), "offload-connect-"));
  const grpcPort = await freePort();
  const httpPort = await freePort();
  const metricsPort = await freePort();
  const args = [
    `--grpc_address=127.0.0.1:${grpcPort}`,
    `--http_address=127.0.0.1:${httpPort}`,
    `--metrics_address=127.0.0.1:${metricsPort}`,
    `--data_dir=${dataDir}`,
    "--backend=libsodium",
    ...extraArgs,
    ...(process.env.OFFLOAD_SERVER_EXTRA_ARGS ?? "").split(" ").filter(Boolean),
  ];
  const env = { ...process.env, OFFLOAD_KEK: randomBytes(32).toString("hex") };
  const child = spawn(binary, args, { env, stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  child.stderr.on("data", (d) => (log += d.toString()));
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const closed = new Promise((resolve) => child.on("close", resolve)); // stderr read to its end

  const http = `${scheme}://127.0.0.1:${httpPort}`;
  const deadline = Date.now() + 60000; // an ASan server on a busy machine
  for (;;) {
    if (child.exitCode !== null) {
      await closed; // its last words are in `log`
      rmSync(dataDir, { recursive: true, force: true });
      throw new Error(`offload_server exited early:\n${log}`);
    }
    // Its own server_started line first: on a port taken by another test's server, that one
    // would answer the probe.
    try {
      if (log.includes('"event":"server_started"') && (await readyStatus(scheme, httpPort, ca)) === 200) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`offload_server not ready after 60 s:\n${log}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    http,
    grpc: `${scheme}://127.0.0.1:${grpcPort}`,
    metrics: `http://127.0.0.1:${metricsPort}/metrics`,
    httpPort,
    pid: child.pid,
    log: () => log,
    alive: () => child.exitCode === null,
    async stop() {
      child.kill("SIGTERM");
      const result = await exited;
      rmSync(dataDir, { recursive: true, force: true });
      return result;
    },
  };
}
