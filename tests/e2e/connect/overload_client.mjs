// An open-loop load of BatchVerify calls for e2e.overload_clients (../test_overload_clients.py):
// @grpc/grpc-js against the gRPC port, or @connectrpc/connect-node (Connect protocol over h2c)
// against the HTTP port. Calls go out at --rate per second for --seconds, whatever the answers,
// over --channels connections, each with a deadline of --deadline_ms. Every answer is checked
// (--items results, all invalid: the request's signatures are over other messages); every
// refusal's retry delay is decoded with the client's own status-details support and code
// generated from proto/google/rpc (node generate.mjs first):
//   grpc-js: the grpc-status-details-bin metadata, a google.rpc.Status holding a RetryInfo Any;
//   connect-node: ConnectError.findDetails(RetryInfoSchema).
// Prints one JSON line: {"client", "sent", "codes": {name: count}, "wrong", "retry": {"with",
// "without", "min_ms", "max_ms"}, "retry_after": {"with", "without"}, "messages": [...]}.
//
//   node overload_client.mjs --client=grpc-js --address=127.0.0.1:50051 --rate=200 \
//       --seconds=10 --deadline_ms=2000 --request_file=req.bin --items=32
import { readFileSync } from "node:fs";

import { fromBinary } from "@bufbuild/protobuf";
import { anyIs, anyUnpack } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";

import { RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { StatusSchema } from "./gen/google/rpc/status_pb.js";
import {
  BatchVerifyRequestSchema,
  BatchVerifyResponseSchema,
  Ed25519Service,
} from "./gen/offload/v1/ed25519_pb.js";

const args = Object.fromEntries(
  process.argv.slice(2).map((a) => {
    const m = /^--([a-z_]+)=(.*)$/.exec(a);
    if (!m) throw new Error(`bad argument ${a}`);
    return [m[1], m[2]];
  }),
);
const client = args.client;
const rate = Number(args.rate);
const seconds = Number(args.seconds);
const deadlineMs = Number(args.deadline_ms ?? 2000);
const channels = Number(args.channels ?? 2);
const items = Number(args.items);
const requestBytes = readFileSync(args.request_file);
const request = fromBinary(BatchVerifyRequestSchema, requestBytes);

const out = {
  client,
  sent: 0,
  codes: {},
  wrong: 0,
  retry: { with: 0, without: 0, min_ms: null, max_ms: null },
  retry_after: { with: 0, without: 0 },
  messages: [],
};
const count = (name) => {
  out.codes[name] = (out.codes[name] ?? 0) + 1;
};
const note = (message) => {
  if (out.messages.length < 10 && !out.messages.includes(message)) out.messages.push(message);
};
const delayMs = (info) =>
  Number(info.retryDelay?.seconds ?? 0n) * 1000 + (info.retryDelay?.nanos ?? 0) / 1e6;
const retryFound = (ms) => {
  if (ms === null) {
    out.retry.without++;
    return;
  }
  out.retry.with++;
  out.retry.min_ms = out.retry.min_ms === null ? ms : Math.min(out.retry.min_ms, ms);
  out.retry.max_ms = out.retry.max_ms === null ? ms : Math.max(out.retry.max_ms, ms);
};
const checkAnswer = (response) => {
  const ok =
    response.results.length === items &&
    response.results.every((r) => !r.valid && (r.status?.code ?? 0) === 0);
  if (!ok) out.wrong++;
};

// One call: resolves once it ended, however.
let call;
let close = () => {};
if (client === "grpc-js") {
  const grpcCodes = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));
  const conns = [];
  for (let i = 0; i < channels; i++) {
    // A connection of its own each (no shared subchannel pool).
    conns.push(
      new grpc.Client(args.address, grpc.credentials.createInsecure(), {
        "grpc.use_local_subchannel_pool": 1,
        "grpc.enable_retries": 0,
        "grpc.max_receive_message_length": 64 << 20,
      }),
    );
  }
  close = () => conns.forEach((c) => c.close());
  let next = 0;
  call = () =>
    new Promise((resolve) => {
      const c = conns[next++ % conns.length];
      c.makeUnaryRequest(
        "/offload.v1.Ed25519Service/BatchVerify",
        (b) => b,
        (b) => b,
        requestBytes,
        new grpc.Metadata(),
        { deadline: new Date(Date.now() + deadlineMs) },
        (err, bytes) => {
          if (!err) {
            count("OK");
            checkAnswer(fromBinary(BatchVerifyResponseSchema, bytes));
            return resolve();
          }
          const name = grpcCodes[err.code] ?? String(err.code);
          count(name);
          if (name !== "RESOURCE_EXHAUSTED" && name !== "DEADLINE_EXCEEDED") {
            note(`${name}: ${err.details}`);
          }
          if (name === "RESOURCE_EXHAUSTED") {
            const [bin] = err.metadata?.get("grpc-status-details-bin") ?? [];
            let ms = null;
            if (bin) {
              const status = fromBinary(StatusSchema, bin);
              for (const any of status.details) {
                if (anyIs(any, RetryInfoSchema)) ms = delayMs(anyUnpack(any, RetryInfoSchema));
              }
            }
            retryFound(ms);
          }
          resolve();
        },
      );
    });
} else if (client === "connect") {
  const transports = [];
  for (let i = 0; i < channels; i++) {
    transports.push(
      // Node's HTTP/2 session refuses response headers while the session's memory is past
      // maxSessionMemory (10 MB by default): an overloaded client, its calls queued in its
      // session, then resets its own streams (NGHTTP2_ENHANCE_YOUR_CALM) - a cut no server can
      // prevent. grpc-js lifts the limit for its sessions; so does this client.
      createConnectTransport({
        baseUrl: `http://${args.address}`,
        httpVersion: "2",
        nodeOptions: { maxSessionMemory: Number.MAX_SAFE_INTEGER },
      }),
    );
  }
  const clients = transports.map((t) => createClient(Ed25519Service, t));
  let next = 0;
  call = async () => {
    const c = clients[next++ % clients.length];
    try {
      checkAnswer(await c.batchVerify(request, { timeoutMs: deadlineMs }));
      count("OK");
    } catch (e) {
      const err = ConnectError.from(e);
      // gRPC's names, as the other clients report them.
      const name = Code[err.code]
        .replace(/([a-z])([A-Z])/g, "$1_$2")
        .toUpperCase();
      count(name);
      if (err.code !== Code.ResourceExhausted && err.code !== Code.DeadlineExceeded) {
        note(`${name}: ${err.rawMessage}`);
      }
      if (err.code === Code.ResourceExhausted) {
        const [info] = err.findDetails(RetryInfoSchema);
        retryFound(info ? delayMs(info) : null);
        if (err.metadata.get("retry-after") !== null) out.retry_after.with++;
        else out.retry_after.without++;
      }
    }
  };
} else {
  throw new Error(`--client: grpc-js or connect, not ${client}`);
}

// Open loop: call i goes out at start + i / rate, whatever the answers. Behind schedule, the
// loop still yields to I/O (setImmediate) between calls, so that answers are read and calls
// written while it catches up: a client that starves its own event loop would time out calls
// it never sent.
const pending = [];
const start = performance.now();
const total = Math.round(rate * seconds);
for (let i = 0; i < total; i++) {
  const due = start + (i * 1000) / rate;
  const wait = due - performance.now();
  await new Promise((r) => (wait > 1 ? setTimeout(r, wait) : setImmediate(r)));
  out.sent++;
  pending.push(call());
}
await Promise.all(pending);
close();
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
