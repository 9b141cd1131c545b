// OffloadClient: the crypto-offload client for web pages, React Native and Node.
//
//   const client = createOffloadClient({
//     baseUrl: "https://offload.example.com",           // Connect over fetch; or `transport`
//     tokenProvider: async ({ refresh }) => auth.token(refresh),
//     memo: { open: { maxAgeMs: 5 * 60_000 } },          // 8 MiB of plaintexts, 5 minutes at most
//   });
//   const blobs = await Promise.all(envelopes.map((envelope) => client.open({ keyId, envelope })));
//   // one BatchOpen the first time; no request at all the next time
//
// What it adds to the generated connect-es clients (all of them are in `client.services`):
// - memos (open, derive, verify) under the service's rules: successful results only, keys are
//   salted digests, values wiped when they leave, least recently used under one byte budget, a
//   maximum age for every entry of the open and derive memos (the caller's to give);
// - auto-batching: calls of one kind made in the same tick go as one Batch* call (chunked at
//   the server's 1024 items), each caller getting its own result or error;
// - retries with backoff and jitter on UNAVAILABLE and RESOURCE_EXHAUSTED, at least as long as
//   the server asks (RetryInfo, Retry-After), within each call's deadline;
// - a bearer token from the caller's provider, asked again once on UNAUTHENTICATED;
// - a refusal about a key (NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED) drops every memo
//   entry of that key at once; an error about one input (INVALID_ARGUMENT) does not.
// Not thread-safe in any sense JavaScript lacks: use one client per JS realm (page, worker, app).
import type { DescMessage, DescMethodUnary, DescService, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import type { Transport } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";

import type { CryptoProvider } from "./digest.js";
import { Digester, platformCrypto } from "./digest.js";
import { isKeyRefusal, isRetryable, itemError, serverRetryDelayMs } from "./errors.js";
import type { MemoStats } from "./memo.js";
import { kByteArrayOverheadBytes, Memo } from "./memo.js";
import { AeadService } from "./gen/offload/v1/aead_pb.js";
import type { AeadSealResponse, AeadRewrapResponse } from "./gen/offload/v1/aead_pb.js";
import { BoxService } from "./gen/offload/v1/box_pb.js";
import type { BoxOpenResponse, BoxSealResponse } from "./gen/offload/v1/box_pb.js";
import { Ed25519Service } from "./gen/offload/v1/ed25519_pb.js";
import type { SignResponse } from "./gen/offload/v1/ed25519_pb.js";
import { KeyService } from "./gen/offload/v1/keys_pb.js";
import { DeriveOutput, X25519Service } from "./gen/offload/v1/x25519_pb.js";

export const kMiB = 1024 * 1024;
/** The server's default --max_batch_items: larger batches are sent in chunks of this size. */
export const kMaxBatchItems = 1024;

/** Asked for a bearer token before the first call and, with `refresh: true`, once after UNAUTHENTICATED. */
export type TokenProvider = (request: {
  /** True when the server refused the token given before (`rejected`): return a fresh one. */
  refresh: boolean;
  rejected?: string;
}) => string | Promise<string>;

export interface RetryOptions {
  /** Attempts in all, the first included (default 4; 1: no retry). */
  maxAttempts?: number;
  /** The first backoff's upper bound (default 100 ms); doubles per attempt, full jitter. */
  initialBackoffMs?: number;
  /** Upper bound of a backoff the client chooses (default 5000 ms); a delay the server asks for is waited in full. */
  maxBackoffMs?: number;
}

export interface OpenMemoOptions {
  /** Required: entries older than this are never used. */
  maxAgeMs: number;
  /** One budget across all keys (default 8 MiB): plaintexts plus ~550 bytes per entry. */
  maxBytes?: number;
}
export interface DeriveMemoOptions {
  /** Required: entries older than this are never used. */
  maxAgeMs: number;
  /** Default 1 MiB (~580 bytes per entry: about 1800 entries). */
  maxBytes?: number;
}
export interface VerifyMemoOptions {
  /** Default 1 MiB (~260 bytes per entry: about 4000 entries). Valid results only; they need no age. */
  maxBytes?: number;
}

export interface OffloadClientOptions {
  /** A connect-es transport (any protocol, any platform). Or give `baseUrl` for a fetch transport. */
  transport?: Transport;
  /** The server's HTTP port, e.g. "https://offload.example.com": Connect or gRPC-Web over fetch. */
  baseUrl?: string;
  /** With `baseUrl`: "connect" (default) or "grpc-web". */
  protocol?: "connect" | "grpc-web";
  /** With `baseUrl`: binary protobuf (default) or JSON (Connect only). */
  binary?: boolean;
  /** With `baseUrl`: the fetch to use (default globalThis.fetch). */
  fetch?: typeof globalThis.fetch;
  /** A call's deadline unless the call gives its own `timeoutMs` (default 10000), retries included. */
  timeoutMs?: number;
  /** Headers sent on every call. */
  headers?: HeadersInit;
  tokenProvider?: TokenProvider;
  /** false: no retry. */
  retry?: RetryOptions | false;
  /** Auto-batching (default on): calls of one kind within `windowMs` (default 0: the same tick) go as one batch. */
  batching?: boolean | { windowMs?: number; maxItems?: number };
  memo?: {
    /** Off unless given. */
    open?: OpenMemoOptions | false;
    /** Off unless given. */
    derive?: DeriveMemoOptions | false;
    /** On by default (1 MiB); false turns it off. */
    verify?: VerifyMemoOptions | false;
  };
  /** SHA-256 and random bytes for the memo keys where there is no WebCrypto (React Native). */
  crypto?: CryptoProvider;
  /** Milliseconds of a monotonic clock (default performance.now, else Date.now): memo ages, deadlines. */
  now?: () => number;
  /**
   * Milliseconds of the wall clock (default Date.now): memo ages too, since a monotonic clock may
   * stop while the device sleeps. An entry is too old when either clock says so, or when the wall
   * clock went back past the time it was kept.
   */
  wallNow?: () => number;
  /** Uniform in [0, 1) for the backoff jitter (default Math.random). */
  random?: () => number;
}

/** Per-call options of every method. */
export interface CallOptions {
  /** This call's deadline in milliseconds, retries included (default: the client's `timeoutMs`). */
  timeoutMs?: number;
  signal?: AbortSignal;
  headers?: HeadersInit;
}

export interface ClientStats {
  /** RPCs sent (each attempt of each call, single or batch). */
  requests: number;
  /** Of them, Batch* calls made by auto-batching, and the items they carried. */
  batches: number;
  batchedItems: number;
  /** Attempts that were retries (UNAVAILABLE, RESOURCE_EXHAUSTED). */
  retries: number;
  /** Of them, retries sent after waiting the delay the server gave (RetryInfo or Retry-After). */
  retriesAfterServerDelay: number;
  /** Times the token provider was asked again after UNAUTHENTICATED. */
  tokenRefreshes: number;
  /** Per memo (null: off). */
  memos: { open: MemoStats | null; derive: MemoStats | null; verify: MemoStats | null };
}

export interface OpenResult {
  /** The caller's own copy: wipe it (`plaintext.fill(0)`) when done, if it is secret. */
  plaintext: Uint8Array;
  keyVersion: number;
  /** Served from a memo: the server's (memo_hit) or this client's. */
  memoHit: boolean;
  /** Served from this client's memo: no request was sent. */
  local: boolean;
}
export interface DeriveResult {
  /** The caller's own copy: wipe it when done. */
  sharedKey: Uint8Array;
  keyVersion: number;
  memoHit: boolean;
  local: boolean;
}
export interface VerifyResult {
  valid: boolean;
  memoHit: boolean;
  local: boolean;
}

export interface OpenRequest {
  keyId: string;
  envelope: Uint8Array;
  associatedData?: Uint8Array;
}
export interface SealRequest {
  keyId: string;
  plaintext: Uint8Array;
  associatedData?: Uint8Array;
}
export interface DeriveRequest {
  keyId: string;
  peerPublicKey: Uint8Array;
  /** Default RAW. */
  output?: DeriveOutput;
  /** 0 (default): the current version. */
  keyVersion?: number;
}
export interface VerifyRequest {
  publicKey: Uint8Array;
  message: Uint8Array;
  signature: Uint8Array;
}
export interface SignRequest {
  keyId: string;
  message: Uint8Array;
}
export interface BoxSealRequest {
  keyId: string;
  peerPublicKey: Uint8Array;
  plaintext: Uint8Array;
  nonce?: Uint8Array;
}
export interface BoxOpenRequest {
  keyId: string;
  peerPublicKey: Uint8Array;
  nonce: Uint8Array;
  ciphertext: Uint8Array;
  keyVersion?: number;
}

/** The typed promise client of a service: one method per RPC, through the client's retries and token. */
export type ServiceClient<S extends DescService> = {
  [K in keyof S["method"]]: S["method"][K] extends DescMethodUnary<infer I, infer O>
    ? (request: MessageInitShape<I>, options?: CallOptions) => Promise<MessageShape<O>>
    : never;
};

type ItemOutcome<R> = { ok: true; value: R } | { ok: false; code: number; message: string };

// One kind of auto-batched operation: its single and batch RPCs and how to read their answers.
interface Kind<Q, R> {
  name: string;
  single: DescMethodUnary;
  batch: DescMethodUnary;
  keyId: (q: Q) => string | undefined;
  toItem: (q: Q) => Record<string, unknown>;
  fromSingle: (res: any) => R;
  fromBatch: (item: any) => ItemOutcome<R>;
  // The memo in front of it, if any.
  memo?: () => MemoHook<Q, R, any> | undefined;
  // Read before the request is sent, given to onSuccess: Seal's open-memo generation.
  snapshot?: (q: Q) => number;
  // Awaited with each success before its caller gets it: Seal records its envelope.
  onSuccess?: (q: Q, r: R, snapshot: number, scope: string) => Promise<void>;
  // A second caller's copy of a result (secret bytes copied); default: the same object.
  clone?: (r: R) => R;
  // The client's own copy of a request's bytes, taken when the call is made, when a memo keys or
  // keeps them: the digest, the request sent and what is remembered then all see the same bytes,
  // whatever the caller does with its buffers meanwhile. Undefined: the caller's request as is.
  own?: (q: Q) => Q;
  // Wipes the secret bytes of an owned request once it is done with (Seal's plaintext copy).
  release?: (q: Q) => void;
  // A refusal of the request before anything (the memo included) sees it, as the server would
  // refuse it, or undefined.
  validate?: (q: Q) => ConnectError | undefined;
}

interface MemoHook<Q, R, V> {
  memo: Memo<V>;
  // `scope`: the call's per-call headers, canonical (headerScope): open and derive entries are
  // kept per scope, so a result fetched under one caller's headers (its `authorization`) is
  // never answered to a call made with other headers. Verify answers depend on no identity.
  digest: (q: Q, scope: string) => Promise<string>;
  keep: (q: Q, r: R) => V | undefined; // a copy to keep, or undefined: not remembered
  answer: (v: V) => R; // a fresh copy for the caller
  sent: (q: Q) => number;
  received: (v: V) => number;
}

interface Pending<Q, R> {
  q: Q; // the caller's request, or the client's own copy of it (Kind.own)
  resolve: (r: R) => void;
  reject: (e: unknown) => void;
  deadline: number;
  signal?: AbortSignal;
  headers?: HeadersInit;
  scope: string; // `headers`, canonical (headerScope): its batch queue and its memo entries
  settled: boolean;
  timer?: ReturnType<typeof setTimeout>;
  onAbort?: () => void;
}

const outcomeOf = <R>(status: { code: number; message: string } | undefined, value: () => R): ItemOutcome<R> =>
  status && status.code !== 0 ? { ok: false, code: status.code, message: status.message } : { ok: true, value: value() };

// KeyService methods that change a key: never retried unless the server said the call did not
// run (RESOURCE_EXHAUSTED, or a retry delay); a success drops the key's memo entries.
const kKeyChanges = new Set([
  "CreateKey", "ImportKey", "RotateKey", "DeleteKey", "CancelKeyDeletion", "DisableKey", "EnableKey",
  "DisableKeyVersion", "EnableKeyVersion", "DestroyKeyVersion", "RestoreKeyVersion", "SetMinDecryptionVersion",
]);

// A copy with memory of its own: for a Node Buffer (a Uint8Array too), slice() is a view of the
// same memory, which the caller may wipe or reuse.
function copy(b: Uint8Array): Uint8Array {
  return new Uint8Array(b);
}

// A secret of an answer (a plaintext, a shared key) as the caller's own: a copy with memory of
// its own, and the answer's bytes zero-filled. Decoded from binary protobuf, the secrets of a
// batch answer are views into one response buffer: handed out as they are, every caller of the
// batch would hold every other caller's plaintext.
function take(b: Uint8Array): Uint8Array {
  const mine = copy(b);
  b.fill(0);
  return mine;
}

// The queue of a call: its kind and its per-call headers, canonical (names lower-cased and
// sorted, repeated ones joined, as `Headers` iterates them). Calls with different headers are
// never batched together, nor asked once as equal inputs: the batch would go out with one
// caller's headers (its token, its identity) for all of them. The deadline is not part of it:
// a batch runs to the latest of its callers' deadlines, and each caller's own ends its own call.
function batchKey(kind: Kind<any, any>, scope: string): string {
  return JSON.stringify([kind.name, scope]);
}

// Per-call headers, canonical: "" for none, else their sorted pairs as JSON. Throws a TypeError
// for a malformed header (as `Headers` does).
function headerScope(headers: HeadersInit | undefined): string {
  const pairs: [string, string][] = [];
  if (headers !== undefined) new Headers(headers).forEach((v, k) => pairs.push([k, v]));
  if (pairs.length === 0) return "";
  pairs.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return JSON.stringify(pairs);
}

/**
 * Zero-fills the secret bytes a result of the client's methods carries: `plaintext` (open,
 * boxOpen) and `sharedKey` (derive). Other results (envelopes, signatures) have none.
 */
function wipeSecrets(result: unknown): void {
  if (typeof result !== "object" || result === null) return;
  for (const field of ["plaintext", "sharedKey"]) {
    const b = (result as Record<string, unknown>)[field];
    if (b instanceof Uint8Array) b.fill(0);
  }
}

/**
 * Gives a call its outcome, once: the first outcome resolves or rejects it; any later one (the
 * answer that arrives after the caller's deadline passed or its signal aborted) is taken by
 * nobody, so its secret bytes - the copy made for that caller alone - are zero-filled here.
 * Internal: exported for the tests.
 */
export function settlePending<R>(p: Pending<any, R>, ok: boolean, value: unknown): void {
  if (p.settled) {
    if (ok) wipeSecrets(value);
    return;
  }
  p.settled = true;
  if (p.timer !== undefined) clearTimeout(p.timer);
  if (p.onAbort) p.signal?.removeEventListener("abort", p.onAbort);
  if (ok) p.resolve(value as R);
  else p.reject(value);
}

// A uint32 field of the request: an integer from 0 to 2^32 - 1, or absent. Anything else is
// refused INVALID_ARGUMENT naming the field; the memo's digest must never see it (it would
// wrap: 2^32 + 1 and 1.5 would be answered as version 1).
function checkUint32(field: string, v: number | undefined): ConnectError | undefined {
  if (v === undefined || (Number.isInteger(v) && v >= 0 && v <= 0xffffffff)) return undefined;
  return new ConnectError(`${field}: expected an integer from 0 to 4294967295, got ${String(v)}`, Code.InvalidArgument);
}

function defaultNow(): () => number {
  const p = (globalThis as { performance?: { now(): number } }).performance;
  return p && typeof p.now === "function" ? () => p.now() : () => Date.now();
}

export class OffloadClient {
  /** The typed clients of every service: each RPC of proto/offload/v1, with retries and the token. */
  readonly services: {
    keys: ServiceClient<typeof KeyService>;
    ed25519: ServiceClient<typeof Ed25519Service>;
    x25519: ServiceClient<typeof X25519Service>;
    box: ServiceClient<typeof BoxService>;
    aead: ServiceClient<typeof AeadService>;
  };

  private readonly transport: Transport;
  private readonly timeoutMs: number;
  private readonly headers?: HeadersInit;
  private readonly retry: Required<RetryOptions>;
  private readonly batchWindowMs: number | undefined; // undefined: no batching
  private readonly maxItems: number;
  private readonly now: () => number;
  private readonly wallNow: () => number;
  private readonly random: () => number;
  private readonly tokenProvider?: TokenProvider;
  private tokenPromise?: Promise<string>;
  private tokenValue?: string;
  private refreshing?: Promise<void>;
  private digester?: Promise<Digester>;
  private readonly cryptoProvider?: CryptoProvider;
  private readonly openMemo?: Memo<{ plaintext: Uint8Array; keyVersion: number }>;
  private readonly deriveMemo?: Memo<{ sharedKey: Uint8Array; keyVersion: number }>;
  private readonly verifyMemo?: Memo<true>;
  // The tick's calls waiting to be batched, per kind and per set of per-call headers (batchKey).
  private readonly queues = new Map<string, Pending<any, any>[]>();
  private readonly counters = { requests: 0, batches: 0, batchedItems: 0, retries: 0, retriesAfterServerDelay: 0, tokenRefreshes: 0 };
  private readonly kinds;

  constructor(options: OffloadClientOptions) {
    if (options.transport) {
      this.transport = options.transport;
    } else if (options.baseUrl) {
      this.transport = createFetchTransport({
        baseUrl: options.baseUrl,
        protocol: options.protocol,
        binary: options.binary,
        fetch: options.fetch,
      });
    } else {
      throw new Error("crypto-offload client: give `transport` or `baseUrl`");
    }
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.headers = options.headers;
    const r = options.retry === false ? { maxAttempts: 1 } : options.retry ?? {};
    this.retry = {
      maxAttempts: Math.max(1, r.maxAttempts ?? 4),
      initialBackoffMs: r.initialBackoffMs ?? 100,
      maxBackoffMs: r.maxBackoffMs ?? 5000,
    };
    const b = options.batching ?? true;
    this.batchWindowMs = b === false ? undefined : b === true ? 0 : b.windowMs ?? 0;
    this.maxItems = (typeof b === "object" && b.maxItems) || kMaxBatchItems;
    this.now = options.now ?? defaultNow();
    this.wallNow = options.wallNow ?? (() => Date.now());
    this.random = options.random ?? Math.random;
    this.tokenProvider = options.tokenProvider;
    this.cryptoProvider = options.crypto;

    const m = options.memo ?? {};
    const wipeBytes = (field: "plaintext" | "sharedKey") => (v: any) => v[field].fill(0);
    if (m.open) {
      if (!(m.open.maxAgeMs > 0)) throw new Error("memo.open.maxAgeMs is required (> 0)");
      this.openMemo = new Memo({
        maxBytes: m.open.maxBytes ?? 8 * kMiB,
        maxAgeMs: m.open.maxAgeMs,
        now: this.now,
        wallNow: this.wallNow,
        size: (v) => v.plaintext.length + kByteArrayOverheadBytes,
        wipe: wipeBytes("plaintext"),
      });
    }
    if (m.derive) {
      if (!(m.derive.maxAgeMs > 0)) throw new Error("memo.derive.maxAgeMs is required (> 0)");
      this.deriveMemo = new Memo({
        maxBytes: m.derive.maxBytes ?? kMiB,
        maxAgeMs: m.derive.maxAgeMs,
        now: this.now,
        wallNow: this.wallNow,
        size: (v) => v.sharedKey.length + kByteArrayOverheadBytes,
        wipe: wipeBytes("sharedKey"),
      });
    }
    if (m.verify !== false) {
      this.verifyMemo = new Memo<true>({
        maxBytes: m.verify?.maxBytes ?? kMiB,
        now: this.now,
        wallNow: this.wallNow,
        size: () => 1,
        wipe: () => {},
      });
    }

    const invoke = (method: DescMethodUnary, input: any, opts?: CallOptions) =>
      this.invoke(method, input, this.deadlineOf(opts), opts?.signal, opts?.headers);
    const wrap = <S extends DescService>(service: S): ServiceClient<S> => {
      const out: Record<string, unknown> = {};
      for (const method of service.methods) {
        if (method.methodKind === "unary") {
          const unary = method as DescMethodUnary;
          out[method.localName] = (req: unknown, opts?: CallOptions) => invoke(unary, req, opts);
        }
      }
      return out as ServiceClient<S>;
    };
    this.services = {
      keys: wrap(KeyService),
      ed25519: wrap(Ed25519Service),
      x25519: wrap(X25519Service),
      box: wrap(BoxService),
      aead: wrap(AeadService),
    };
    this.kinds = this.makeKinds();
  }

  /** Decrypts an AEAD envelope: from the open memo when it holds it, else batched with the tick's other opens. */
  open(request: OpenRequest, options?: CallOptions): Promise<OpenResult> {
    return this.call(this.kinds.open, request, options);
  }

  /** Seals under the key's current version; with the open memo on, the envelope is remembered (an echo costs nothing). */
  seal(request: SealRequest, options?: CallOptions): Promise<AeadSealResponse> {
    return this.call(this.kinds.seal, request, options);
  }

  /** Moves an envelope to the key's current version inside the service (the plaintext never leaves it). */
  rewrap(request: OpenRequest, options?: CallOptions): Promise<AeadRewrapResponse> {
    return this.call(this.kinds.rewrap, request, options);
  }

  /** X25519 (raw) or the NaCl box key (output BOX_BEFORENM) of a managed key and a peer; from the derive memo when on. */
  derive(request: DeriveRequest, options?: CallOptions): Promise<DeriveResult> {
    return this.call(this.kinds.derive, request, options);
  }

  /** Ed25519 verification; valid answers are remembered by the verify memo (on by default). */
  verify(request: VerifyRequest, options?: CallOptions): Promise<VerifyResult> {
    return this.call(this.kinds.verify, request, options);
  }

  sign(request: SignRequest, options?: CallOptions): Promise<SignResponse> {
    return this.call(this.kinds.sign, request, options);
  }

  boxSeal(request: BoxSealRequest, options?: CallOptions): Promise<BoxSealResponse> {
    return this.call(this.kinds.boxSeal, request, options);
  }

  boxOpen(request: BoxOpenRequest, options?: CallOptions): Promise<BoxOpenResponse> {
    return this.call(this.kinds.boxOpen, request, options);
  }

  /** Wipes and drops every memo entry of `keyId` (what a refusal about the key does). */
  forgetKey(keyId: string): void {
    this.openMemo?.dropKey(keyId);
    this.deriveMemo?.dropKey(keyId);
  }

  /** Wipes and drops every memo entry (on sign-out, say). */
  clearMemos(): void {
    this.openMemo?.clear();
    this.deriveMemo?.clear();
    this.verifyMemo?.clear();
  }

  stats(): ClientStats {
    return {
      ...this.counters,
      memos: {
        open: this.openMemo?.stats() ?? null,
        derive: this.deriveMemo?.stats() ?? null,
        verify: this.verifyMemo?.stats() ?? null,
      },
    };
  }

  // ---- kinds -----------------------------------------------------------------------------

  private makeKinds() {
    const self = this;
    const aead = AeadService.method;
    const ed = Ed25519Service.method;
    const x = X25519Service.method;
    const box = BoxService.method;
    const openHook: MemoHook<OpenRequest, OpenResult, { plaintext: Uint8Array; keyVersion: number }> | undefined =
      this.openMemo && {
        memo: this.openMemo,
        digest: async (q, scope) =>
          (await self.digests()).digest("open", scope, q.keyId, q.envelope, q.associatedData ?? new Uint8Array()),
        keep: (_q, r) => ({ plaintext: copy(r.plaintext), keyVersion: r.keyVersion }),
        answer: (v) => ({ plaintext: copy(v.plaintext), keyVersion: v.keyVersion, memoHit: true, local: true }),
        sent: (q) => q.keyId.length + q.envelope.length + (q.associatedData?.length ?? 0),
        received: (v) => v.plaintext.length,
      };
    const deriveHook: MemoHook<DeriveRequest, DeriveResult, { sharedKey: Uint8Array; keyVersion: number }> | undefined =
      this.deriveMemo && {
        memo: this.deriveMemo,
        digest: async (q, scope) =>
          (await self.digests()).digest("derive", scope, q.keyId, q.keyVersion ?? 0, q.output ?? DeriveOutput.RAW, q.peerPublicKey),
        keep: (_q, r) => ({ sharedKey: copy(r.sharedKey), keyVersion: r.keyVersion }),
        answer: (v) => ({ sharedKey: copy(v.sharedKey), keyVersion: v.keyVersion, memoHit: true, local: true }),
        sent: (q) => q.keyId.length + q.peerPublicKey.length + 8,
        received: (v) => v.sharedKey.length + 4,
      };
    const verifyHook: MemoHook<VerifyRequest, VerifyResult, true> | undefined = this.verifyMemo && {
      memo: this.verifyMemo,
      digest: async (q) => (await self.digests()).digest("verify", q.publicKey, q.signature, q.message),
      keep: (_q, r) => (r.valid ? true : undefined), // invalid answers are never remembered
      answer: () => ({ valid: true, memoHit: true, local: true }),
      sent: (q) => q.publicKey.length + q.signature.length + q.message.length,
      received: () => 2,
    };

    const open: Kind<OpenRequest, OpenResult> = {
      name: "open",
      single: aead.open,
      batch: aead.batchOpen,
      keyId: (q) => q.keyId,
      toItem: (q) => ({ keyId: q.keyId, envelope: q.envelope, associatedData: q.associatedData }),
      fromSingle: (r) => ({ plaintext: take(r.plaintext), keyVersion: r.keyVersion, memoHit: r.memoHit, local: false }),
      fromBatch: (it) => outcomeOf(it.status, () => open.fromSingle(it.response)),
      memo: () => openHook,
      clone: (r) => ({ ...r, plaintext: copy(r.plaintext) }),
      own: openHook && ((q) => ({ keyId: q.keyId, envelope: copy(q.envelope), associatedData: q.associatedData && copy(q.associatedData) })),
    };
    const seal: Kind<SealRequest, AeadSealResponse> = {
      name: "seal",
      single: aead.seal,
      batch: aead.batchSeal,
      keyId: (q) => q.keyId,
      toItem: (q) => ({ keyId: q.keyId, plaintext: q.plaintext, associatedData: q.associatedData }),
      fromSingle: (r) => r,
      fromBatch: (it) => outcomeOf(it.status, () => it.response),
      // Seal records the envelope it produced, so that opening it costs nothing; a refusal of
      // the key seen while the seal was under way wins (the generation read before sending).
      snapshot: (q) => openHook?.memo.generation(q.keyId) ?? 0,
      onSuccess: async (q, r, generation, scope) => {
        if (!openHook) return;
        try {
          const d = await openHook.digest({ keyId: q.keyId, envelope: r.envelope, associatedData: q.associatedData }, scope);
          openHook.memo.put(d, q.keyId, { plaintext: copy(q.plaintext), keyVersion: r.keyVersion }, generation);
        } catch {
          // not remembered: the seal itself succeeded
        }
      },
      // What is sealed is what is remembered: the plaintext as it was when seal() was called.
      own: openHook && ((q) => ({ keyId: q.keyId, plaintext: copy(q.plaintext), associatedData: q.associatedData && copy(q.associatedData) })),
      release: openHook && ((q) => q.plaintext.fill(0)),
    };
    const rewrap: Kind<OpenRequest, AeadRewrapResponse> = {
      name: "rewrap",
      single: aead.rewrap,
      batch: aead.batchRewrap,
      keyId: (q) => q.keyId,
      toItem: (q) => ({ keyId: q.keyId, envelope: q.envelope, associatedData: q.associatedData }),
      fromSingle: (r) => r,
      fromBatch: (it) => outcomeOf(it.status, () => it.response),
    };
    const derive: Kind<DeriveRequest, DeriveResult> = {
      name: "derive",
      single: x.derive,
      batch: x.batchDerive,
      keyId: (q) => q.keyId,
      toItem: (q) => ({
        keyId: q.keyId,
        keyVersion: q.keyVersion ?? 0,
        peerPublicKey: q.peerPublicKey,
        output: q.output ?? DeriveOutput.RAW,
      }),
      fromSingle: (r) => ({ sharedKey: take(r.sharedKey), keyVersion: r.keyVersion, memoHit: r.memoHit, local: false }),
      fromBatch: (it) => outcomeOf(it.status, () => derive.fromSingle(it.response)),
      memo: () => deriveHook,
      clone: (r) => ({ ...r, sharedKey: copy(r.sharedKey) }),
      validate: (q) => checkUint32("key_version", q.keyVersion) ?? checkUint32("output", q.output),
      own: deriveHook && ((q) => ({ ...q, peerPublicKey: copy(q.peerPublicKey) })),
    };
    const verify: Kind<VerifyRequest, VerifyResult> = {
      name: "verify",
      single: ed.verify,
      batch: ed.batchVerify,
      keyId: () => undefined,
      toItem: (q) => ({ publicKey: q.publicKey, message: q.message, signature: q.signature }),
      fromSingle: (r) => ({ valid: r.valid, memoHit: r.memoHit, local: false }),
      fromBatch: (it) => outcomeOf(it.status, () => ({ valid: it.valid, memoHit: it.memoHit, local: false })),
      memo: () => verifyHook,
      own: verifyHook && ((q) => ({ publicKey: copy(q.publicKey), message: copy(q.message), signature: copy(q.signature) })),
    };
    const sign: Kind<SignRequest, SignResponse> = {
      name: "sign",
      single: ed.sign,
      batch: ed.batchSign,
      keyId: (q) => q.keyId,
      toItem: (q) => ({ keyId: q.keyId, message: q.message }),
      fromSingle: (r) => r,
      fromBatch: (it) => outcomeOf(it.status, () => it.response),
    };
    const boxSeal: Kind<BoxSealRequest, BoxSealResponse> = {
      name: "boxSeal",
      single: box.seal,
      batch: box.batchSeal,
      keyId: (q) => q.keyId,
      toItem: (q) => ({ keyId: q.keyId, peerPublicKey: q.peerPublicKey, plaintext: q.plaintext, nonce: q.nonce }),
      fromSingle: (r) => r,
      fromBatch: (it) => outcomeOf(it.status, () => it.response),
    };
    const boxOpen: Kind<BoxOpenRequest, BoxOpenResponse> = {
      name: "boxOpen",
      single: box.open,
      batch: box.batchOpen,
      keyId: (q) => q.keyId,
      toItem: (q) => ({
        keyId: q.keyId,
        keyVersion: q.keyVersion ?? 0,
        peerPublicKey: q.peerPublicKey,
        nonce: q.nonce,
        ciphertext: q.ciphertext,
      }),
      fromSingle: (r) => ({ ...r, plaintext: take(r.plaintext) }),
      fromBatch: (it) => outcomeOf(it.status, () => boxOpen.fromSingle(it.response)),
      validate: (q) => checkUint32("key_version", q.keyVersion),
    };
    return { open, seal, rewrap, derive, verify, sign, boxSeal, boxOpen };
  }

  // ---- the batching pipeline --------------------------------------------------------------

  private digests(): Promise<Digester> {
    if (!this.digester) {
      this.digester = (this.cryptoProvider ? Promise.resolve(this.cryptoProvider) : platformCrypto()).then((p) =>
        Digester.create(p),
      );
      this.digester.catch(() => (this.digester = undefined));
    }
    return this.digester;
  }

  private deadlineOf(opts?: CallOptions): number {
    return this.now() + (opts?.timeoutMs ?? this.timeoutMs);
  }

  private call<Q, R>(kind: Kind<Q, R>, q: Q, opts?: CallOptions): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      if (opts?.signal?.aborted) {
        reject(new ConnectError("the call was aborted", Code.Canceled));
        return;
      }
      const invalid = kind.validate?.(q);
      if (invalid) {
        reject(invalid);
        return;
      }
      // The per-call headers are read first: a malformed one (CR LF, a non-Latin-1 value) is the
      // caller's INVALID_ARGUMENT before any input is copied or any timer is set.
      let scope: string;
      try {
        scope = headerScope(opts?.headers);
      } catch (e) {
        reject(new ConnectError(`headers: ${e instanceof Error ? e.message : String(e)}`, Code.InvalidArgument));
        return;
      }
      const p: Pending<Q, R> = {
        q: kind.own ? kind.own(q) : q,
        resolve,
        reject,
        deadline: this.deadlineOf(opts),
        signal: opts?.signal,
        headers: opts?.headers,
        scope,
        settled: false,
      };
      // This caller's own deadline and signal, whatever the batch it joins does.
      p.timer = setTimeout(
        () => this.settle(p, false, new ConnectError("the call's deadline passed", Code.DeadlineExceeded)),
        Math.max(0, p.deadline - this.now()),
      );
      if (p.signal) {
        p.onAbort = () => this.settle(p, false, new ConnectError("the call was aborted", Code.Canceled));
        p.signal.addEventListener("abort", p.onAbort, { once: true });
      }
      if (this.batchWindowMs === undefined) {
        void this.process(kind, [p]);
        return;
      }
      // Only calls that would travel the same way share a batch: a Batch* call carries one set of
      // headers, so a caller's own `authorization` (its identity) never speaks for another's.
      const key = batchKey(kind, scope);
      let queue = this.queues.get(key);
      if (!queue) {
        this.queues.set(key, (queue = []));
        setTimeout(() => {
          const items = this.queues.get(key) ?? [];
          this.queues.delete(key);
          void this.process(kind, items);
        }, this.batchWindowMs);
      }
      queue.push(p);
    });
  }

  private settle<R>(p: Pending<any, R>, ok: boolean, value: unknown): void {
    settlePending(p, ok, value);
  }

  // Memo lookups for the tick's calls of one kind, then one request for the misses.
  private async process<Q, R>(kind: Kind<Q, R>, items: Pending<Q, R>[]): Promise<void> {
    const hook = kind.memo?.();
    type Miss = { p: Pending<Q, R>; digest?: string; generation: number; twins: Pending<Q, R>[] };
    const misses: Miss[] = [];
    if (hook) {
      let digests: string[];
      try {
        digests = await Promise.all(items.map((p) => hook.digest(p.q, p.scope)));
      } catch (e) {
        for (const p of items) {
          this.settle(p, false, ConnectError.from(e, Code.Internal));
          kind.release?.(p.q);
        }
        return;
      }
      const byDigest = new Map<string, Miss>();
      items.forEach((p, i) => {
        if (p.settled) {
          kind.release?.(p.q);
          return;
        }
        const d = digests[i];
        const keyId = kind.keyId(p.q) ?? "";
        const generation = hook.memo.generation(keyId);
        const v = hook.memo.get(d, hook.sent(p.q), hook.received);
        if (v !== undefined) {
          this.settle(p, true, hook.answer(v));
          kind.release?.(p.q);
          return;
        }
        const twin = byDigest.get(d); // the same input twice in one tick: asked once
        if (twin) {
          twin.twins.push(p);
          return;
        }
        const miss = { p, digest: d, generation, twins: [] };
        byDigest.set(d, miss);
        misses.push(miss);
      });
    } else {
      for (const p of items) {
        if (p.settled) kind.release?.(p.q);
        else misses.push({ p, generation: 0, twins: [] });
      }
    }
    const live: Miss[] = [];
    for (const m of misses) {
      if (!(m.p.settled && m.twins.every((t) => t.settled))) {
        live.push(m);
      } else {
        for (const p of [m.p, ...m.twins]) kind.release?.(p.q);
      }
    }
    const chunks: Miss[][] = [];
    for (let i = 0; i < live.length; i += this.maxItems) chunks.push(live.slice(i, i + this.maxItems));
    await Promise.all(chunks.map((chunk) => this.send(kind, hook, chunk)));
  }

  private async send<Q, R>(
    kind: Kind<Q, R>,
    hook: MemoHook<Q, R, any> | undefined,
    chunk: { p: Pending<Q, R>; digest?: string; generation: number; twins: Pending<Q, R>[] }[],
  ): Promise<void> {
    if (chunk.length === 0) return;
    const snapshots = chunk.map((m) => kind.snapshot?.(m.p.q) ?? 0);
    // One item's outcome to its caller (and to the callers that asked the same in this tick).
    // A refusal about the key has already dropped the key's entries (afterAnswer, afterRefusal).
    const deliver = async (i: number, outcome: ItemOutcome<R> | { ok: false; error: ConnectError }) => {
      const m = chunk[i];
      const done = () => {
        for (const p of [m.p, ...m.twins]) kind.release?.(p.q);
      };
      if (!outcome.ok) {
        const e = "error" in outcome ? outcome.error : itemError(outcome.code, outcome.message);
        this.settle(m.p, false, e);
        for (const t of m.twins) this.settle(t, false, e);
        done();
        return;
      }
      await kind.onSuccess?.(m.p.q, outcome.value, snapshots[i], m.p.scope);
      if (hook && m.digest !== undefined) {
        const v = hook.keep(m.p.q, outcome.value);
        if (v !== undefined) hook.memo.put(m.digest, kind.keyId(m.p.q) ?? "", v, m.generation);
      }
      for (const t of m.twins) this.settle(t, true, kind.clone ? kind.clone(outcome.value) : outcome.value);
      this.settle(m.p, true, outcome.value);
      done();
    };
    const deadline = Math.max(...chunk.map((m) => Math.max(m.p.deadline, ...m.twins.map((t) => t.deadline))));
    const keys = new Set(chunk.map((m) => kind.keyId(m.p.q)).filter((k): k is string => k !== undefined));
    const headers = new Headers(chunk[0].p.headers); // every caller of a chunk gave the same (batchKey)
    if (keys.size === 1) headers.set("x-offload-key", [...keys][0]);
    if (chunk.length === 1) {
      const only = chunk[0];
      let res;
      try {
        res = await this.invoke(kind.single, kind.toItem(only.p.q), deadline, only.twins.length === 0 ? only.p.signal : undefined, headers);
      } catch (err) {
        await deliver(0, { ok: false, error: ConnectError.from(err) });
        return;
      }
      await deliver(0, { ok: true, value: kind.fromSingle(res) });
      return;
    }
    let res: { results: unknown[] };
    try {
      this.counters.batches++;
      this.counters.batchedItems += chunk.length;
      res = await this.invoke(kind.batch, { items: chunk.map((m) => kind.toItem(m.p.q)) }, deadline, undefined, headers);
      if (res.results.length !== chunk.length) {
        throw new ConnectError(`batch answer has ${res.results.length} results for ${chunk.length} items`, Code.Internal);
      }
    } catch (err) {
      const e = ConnectError.from(err);
      // A batch refused whole because one of its keys is not granted: each key's callers get
      // their own answer, one request per key.
      if (e.code === Code.PermissionDenied && keys.size > 1) {
        const byKey = new Map<string | undefined, typeof chunk>();
        for (const m of chunk) {
          const k = kind.keyId(m.p.q);
          byKey.set(k, [...(byKey.get(k) ?? []), m]);
        }
        await Promise.all([...byKey.values()].map((group) => this.send(kind, hook, group)));
        return;
      }
      await Promise.all(chunk.map((_, i) => deliver(i, { ok: false, error: e })));
      return;
    }
    await Promise.all(chunk.map((_, i) => deliver(i, kind.fromBatch(res.results[i]))));
  }

  // ---- one RPC: token, deadline, retries ---------------------------------------------------

  private currentToken(): Promise<string> | undefined {
    const provider = this.tokenProvider;
    if (!provider) return undefined;
    if (!this.tokenPromise) {
      const t = Promise.resolve().then(() => provider({ refresh: false }));
      this.tokenPromise = t;
      t.then(
        (v) => {
          if (this.tokenPromise === t) this.tokenValue = v;
        },
        () => {
          if (this.tokenPromise === t) this.tokenPromise = undefined;
        },
      );
    }
    return this.tokenPromise;
  }

  // Asks the provider for a fresh token, unless another call has already replaced `rejected`
  // (concurrent refusals of one token make one refresh).
  private refreshToken(rejected: string): Promise<void> {
    const provider = this.tokenProvider!;
    if (this.refreshing) return this.refreshing;
    if (this.tokenValue !== undefined && this.tokenValue !== rejected) return Promise.resolve();
    this.counters.tokenRefreshes++;
    const t = Promise.resolve().then(() => provider({ refresh: true, rejected }));
    this.tokenPromise = t;
    this.tokenValue = undefined;
    const r: Promise<void> = t
      .then(
        (v) => {
          if (this.tokenPromise === t) this.tokenValue = v;
        },
        (e) => {
          if (this.tokenPromise === t) this.tokenPromise = undefined;
          throw e;
        },
      )
      .finally(() => {
        if (this.refreshing === r) this.refreshing = undefined;
      });
    this.refreshing = r;
    return r;
  }

  private async invoke(
    method: DescMethodUnary,
    input: any,
    deadline: number,
    signal?: AbortSignal,
    callHeaders?: HeadersInit,
  ): Promise<any> {
    let refreshed = false;
    for (let attempt = 0; ; ) {
      const remaining = Math.floor(deadline - this.now());
      if (remaining <= 0) throw new ConnectError("the call's deadline passed", Code.DeadlineExceeded);
      const headers = new Headers(this.headers);
      new Headers(callHeaders).forEach((v, k) => headers.set(k, v));
      let token: string | undefined;
      try {
        token = await this.currentToken();
      } catch (e) {
        throw new ConnectError(`the token provider failed: ${String(e)}`, Code.Unauthenticated, undefined, undefined, e);
      }
      if (token !== undefined) headers.set("authorization", `Bearer ${token}`);
      this.counters.requests++;
      try {
        const res = await this.transport.unary(method, signal, remaining, headers, input);
        this.afterAnswer(method, input, res.message);
        return res.message;
      } catch (err) {
        const e = ConnectError.from(err);
        if (e.code === Code.Unauthenticated && this.tokenProvider && !refreshed && token !== undefined) {
          refreshed = true;
          try {
            await this.refreshToken(token);
          } catch {
            throw e;
          }
          continue; // not counted as an attempt
        }
        const serverDelay = serverRetryDelayMs(e);
        const mayRetry =
          isRetryable(e.code) &&
          attempt + 1 < this.retry.maxAttempts &&
          !signal?.aborted &&
          (!(method.parent.typeName === KeyService.typeName && kKeyChanges.has(method.name)) ||
            e.code === Code.ResourceExhausted ||
            serverDelay !== undefined);
        if (!mayRetry) {
          this.afterRefusal(method, input, e);
          throw e;
        }
        const cap = Math.min(this.retry.maxBackoffMs, this.retry.initialBackoffMs * 2 ** attempt);
        const delay =
          serverDelay !== undefined ? serverDelay + this.random() * Math.min(cap, serverDelay * 0.2) : this.random() * cap;
        if (this.now() + delay >= deadline) {
          this.afterRefusal(method, input, e);
          throw e;
        }
        await sleep(delay, signal);
        attempt++;
        this.counters.retries++;
        if (serverDelay !== undefined) this.counters.retriesAfterServerDelay++;
      }
    }
  }

  // Whatever route a call took (a typed service call or the batching pipeline): a key change made
  // through this client, or a batch item refused for its key, drops the key's memo entries.
  private afterAnswer(method: DescMethodUnary, input: any, output: any): void {
    if (method.parent.typeName === KeyService.typeName && kKeyChanges.has(method.name) && typeof input?.keyId === "string") {
      this.forgetKey(input.keyId);
      return;
    }
    const items = input?.items;
    const results = output?.results;
    if (Array.isArray(items) && Array.isArray(results)) {
      results.forEach((r: any, i: number) => {
        const keyId = items[i]?.keyId;
        if (typeof keyId === "string" && r?.status && isKeyRefusal(r.status.code)) this.forgetKey(keyId);
      });
    }
  }

  // A whole call refused for its key (a single-item call, or a batch naming one key).
  private afterRefusal(method: DescMethodUnary, input: any, e: ConnectError): void {
    if (!isKeyRefusal(e.code)) return;
    if (typeof input?.keyId === "string") {
      this.forgetKey(input.keyId);
      return;
    }
    const keys = new Set<string>();
    for (const it of Array.isArray(input?.items) ? input.items : []) if (typeof it?.keyId === "string") keys.add(it.keyId);
    if (keys.size === 1) this.forgetKey([...keys][0]);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(new ConnectError("the call was aborted", Code.Canceled));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export interface FetchTransportOptions {
  baseUrl: string;
  /** "connect" (default) or "grpc-web". */
  protocol?: "connect" | "grpc-web";
  /** Binary protobuf (default true); false: JSON (Connect). */
  binary?: boolean;
  fetch?: typeof globalThis.fetch;
}

/**
 * A connect-es transport on fetch: browsers, React Native, Node 18+ (HTTP/1.1). A fetch that
 * fails before any response (server unreachable or restarting, connection refused or reset) is
 * reported as UNAVAILABLE, as the Node transports report it, so that the client retries it.
 */
export function createFetchTransport(o: FetchTransportOptions): Transport {
  const common = { baseUrl: o.baseUrl, useBinaryFormat: o.binary ?? true, fetch: unavailableWhenUnreached(o.fetch) };
  return o.protocol === "grpc-web" ? createGrpcWebTransport(common) : createConnectTransport(common);
}

// `f` (default: globalThis.fetch, looked up at each call as connect-web does), with a rejection
// before any response turned into ConnectError UNAVAILABLE (the TypeError as its cause).
// connect-web would report it as UNKNOWN "fetch failed", which nothing retries, where the
// server never answered at all. Fetch rejects a network failure with a TypeError (Node's
// undici, browsers, React Native); an abort or a deadline (the signal) stays what it is, and
// an answer of the server, UNKNOWN included, never comes through here.
function unavailableWhenUnreached(f: typeof globalThis.fetch | undefined): typeof globalThis.fetch {
  return async (input, init) => {
    try {
      return await (f ?? globalThis.fetch)(input, init);
    } catch (e) {
      if (e instanceof TypeError && !init?.signal?.aborted) {
        throw new ConnectError(`the server was not reached: ${e.message}`, Code.Unavailable, undefined, undefined, e);
      }
      throw e;
    }
  };
}

/** A client with `options`. */
export function createOffloadClient(options: OffloadClientOptions): OffloadClient {
  return new OffloadClient(options);
}
