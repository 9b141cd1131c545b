// Shared by the interop tests: the API's definitions loaded from proto/ at run time by
// @grpc/proto-loader (nothing generated, nothing committed), grpc-js clients on them, and a
// server on our engine started by ../../connect/test/server.mjs (the same start-up code as the
// Connect test: free loopback ports, temporary data folder, readiness probe).
//   OFFLOAD_SERVER     the offload_server binary (required)
//   OFFLOAD_PROTO_DIR  the repository's proto/ folder (default ../../../proto)
import { readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { startServer } from "../../connect/test/server.mjs";

const here = dirname(fileURLToPath(import.meta.url));
export const PROTO_DIR = resolve(process.env.OFFLOAD_PROTO_DIR ?? join(here, "../../../../proto"));

// The server's --max_message_bytes default (16 MiB), left as it is by these tests.
export const MAX_MESSAGE = 16 << 20;
// Deadline of an ordinary call: far beyond what any call takes, even on a loaded machine. It is
// there so that a server that never answers fails the test instead of hanging it.
export const CALL_SECONDS = 120;

// The offload.v1 files, as a client team would list them: every .proto of the folder.
export const OFFLOAD_FILES = readdirSync(join(PROTO_DIR, "offload/v1"))
  .filter((f) => f.endsWith(".proto"))
  .map((f) => `offload/v1/${f}`);

const definition = protoLoader.loadSync(
  [...OFFLOAD_FILES, "grpc/health/v1/health.proto", "grpc/reflection/v1/reflection.proto"],
  { includeDirs: [PROTO_DIR], keepCase: true, longs: String, enums: String, bytes: Buffer, defaults: true, oneofs: true },
);
export const api = grpc.loadPackageDefinition(definition);

// Every method of every offload.v1 service, "offload.v1.Service/Method", as the .proto files
// define them (read by protobufjs through proto-loader, independently of the server).
export function protoMethods() {
  const out = [];
  for (const [name, def] of Object.entries(definition)) {
    if (!name.startsWith("offload.v1.") || def.format !== undefined) continue; // messages and enums have a format
    for (const method of Object.values(def)) out.push(method.path.slice(1));
  }
  return out.sort();
}

// The offload.v1 service names, from the same definitions.
export function protoServices() {
  return [...new Set(protoMethods().map((m) => m.split("/")[0]))].sort();
}

// A server whose gRPC port runs on our engine. `extraArgs` are appended.
export function startEngineServer(extraArgs = []) {
  return startServer(["--log_requests_sample_rate=1", ...extraArgs]);
}

// "http://127.0.0.1:1234" -> "127.0.0.1:1234", as grpc-js wants a target.
export function target(url) {
  return new URL(url).host;
}

export const channelOptions = {
  "grpc.max_send_message_length": 4 * MAX_MESSAGE,
  "grpc.max_receive_message_length": 4 * MAX_MESSAGE,
  "grpc.enable_http_proxy": 0,
};

// One client per service of the API on `address` ("host:port"), sharing one channel unless
// `options` differ.
export function clients(address, options = {}) {
  const o = { ...channelOptions, ...options };
  const creds = grpc.credentials.createInsecure();
  const v1 = api.offload.v1;
  const keys = new v1.KeyService(address, creds, o);
  const shared = { channelOverride: keys.getChannel() };
  return {
    keys,
    ed25519: new v1.Ed25519Service(address, creds, shared),
    x25519: new v1.X25519Service(address, creds, shared),
    aead: new v1.AeadService(address, creds, shared),
    box: new v1.BoxService(address, creds, shared),
    health: new api.grpc.health.v1.Health(address, creds, shared),
    reflection: new api.grpc.reflection.v1.ServerReflection(address, creds, shared),
    close() {
      keys.close();
    },
  };
}

export function deadline(seconds = CALL_SECONDS) {
  return new Date(Date.now() + seconds * 1000);
}

// A unary call as a promise: resolves to the response, rejects with grpc-js's ServiceError.
// `options.metadata` (a grpc.Metadata) and other call options pass through.
export function unary(client, method, request, { metadata = new grpc.Metadata(), ...options } = {}) {
  return new Promise((resolvePromise, reject) => {
    client[method](request, metadata, { deadline: deadline(), ...options }, (err, response) =>
      err ? reject(err) : resolvePromise(response),
    );
  });
}

// The ServiceError a call failed with (the test fails if it succeeded).
export async function failure(promise) {
  try {
    await promise;
  } catch (e) {
    if (e.code === undefined) throw e;
    return e;
  }
  throw new Error("the call succeeded; an error was expected");
}

export { grpc };
