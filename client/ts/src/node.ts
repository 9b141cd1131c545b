/// <reference types="node" />
// @crypto-offload/client/node: transports on Node's own HTTP stack (connect-node): Connect and
// gRPC-Web over HTTP/2 (h2c or TLS) or HTTP/1.1, and gRPC over HTTP/2 (the gRPC port or the HTTP
// port). Node 18 and later.
import type { Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { webcrypto } from "node:crypto";

import type { CryptoProvider } from "./digest.js";

export interface NodeTransportOptions {
  /** e.g. "http://127.0.0.1:8080" (the HTTP port) or, for "grpc", either port. */
  baseUrl: string;
  /** "connect" (default), "grpc-web" or "grpc". */
  protocol?: "connect" | "grpc-web" | "grpc";
  /** "2" (default; h2c on http://, ALPN on https://) or "1.1" (not for gRPC). */
  httpVersion?: "1.1" | "2";
  /** Binary protobuf (default true); false: JSON. */
  binary?: boolean;
  /**
   * TLS and socket options of node:http2 / node:https (a CA, a client certificate...). Over
   * HTTP/2, `maxSessionMemory` defaults to unbounded here (see createNodeTransport).
   */
  nodeOptions?: Record<string, unknown>;
}

/** A connect-es transport on Node's HTTP/2 (or HTTP/1.1). */
export function createNodeTransport(o: NodeTransportOptions): Transport {
  const useBinaryFormat = o.binary ?? true;
  const httpVersion = o.httpVersion ?? "2";
  // Node's HTTP/2 session refuses response headers while its memory is past maxSessionMemory
  // (10 MB by default) and resets the call (NGHTTP2_ENHANCE_YOUR_CALM): a client with many calls
  // queued at the server's stream limit would cut its own calls. Lifted, as grpc-js lifts it
  // for its sessions; the caller's nodeOptions.maxSessionMemory wins.
  const h2 = o.protocol === "grpc" || httpVersion === "2";
  const nodeOptions = (h2 ? { maxSessionMemory: Number.MAX_SAFE_INTEGER, ...o.nodeOptions } : o.nodeOptions) as never;
  if (o.protocol === "grpc") return createGrpcTransport({ baseUrl: o.baseUrl, useBinaryFormat, nodeOptions });
  const common = { baseUrl: o.baseUrl, httpVersion, useBinaryFormat, nodeOptions } as const;
  return o.protocol === "grpc-web" ? createGrpcWebTransport(common) : createConnectTransport(common);
}

/** Node's WebCrypto as the memos' CryptoProvider (Node 18 has it here, not on globalThis). */
export const nodeCrypto: CryptoProvider = {
  sha256: async (data) => new Uint8Array(await webcrypto.subtle.digest("SHA-256", data)),
  randomBytes: (n) => webcrypto.getRandomValues(new Uint8Array(n)),
};

export * from "./index.js";
