// How the client reads a refusal: is it about the key itself (drop that key's memo entries), may
// the call be tried again and when (RetryInfo, Retry-After), and does the token need refreshing.
import { Code, ConnectError } from "@connectrpc/connect";

import { RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/**
 * Codes that say something about the key named by the call, not about one input: the key is
 * unknown (NOT_FOUND), disabled, pending deletion, of a retired or disabled version, or of the
 * wrong type (FAILED_PRECONDITION), or not granted to the caller (PERMISSION_DENIED). Seeing one
 * drops every memo entry of that key at once. An item error about one envelope or signature
 * (INVALID_ARGUMENT: "authentication failed", a wrong size) does not.
 */
export function isKeyRefusal(code: Code | number): boolean {
  return code === Code.NotFound || code === Code.FailedPrecondition || code === Code.PermissionDenied;
}

/** Codes after which the same call may succeed later: the server was overloaded or going away. */
export function isRetryable(code: Code | number): boolean {
  return code === Code.Unavailable || code === Code.ResourceExhausted;
}

/**
 * The delay the server asked for, in milliseconds, or undefined: the google.rpc.RetryInfo error
 * detail (Connect error JSON `details`, gRPC-Web `grpc-status-details-bin`), else an HTTP
 * `Retry-After` header (seconds, or an HTTP date) on a 429 / 503. Browsers show a cross-origin
 * page `Retry-After` only when the server lists it in `Access-Control-Expose-Headers`.
 */
export function serverRetryDelayMs(e: ConnectError, nowMs: number = Date.now()): number | undefined {
  try {
    for (const info of e.findDetails(RetryInfoSchema)) {
      const d = info.retryDelay;
      if (d !== undefined) {
        const ms = Number(d.seconds) * 1000 + Math.floor(d.nanos / 1e6);
        if (Number.isFinite(ms) && ms >= 0) return ms;
      }
    }
  } catch {
    // an undecodable detail: fall through to the header
  }
  const h = e.metadata.get("retry-after");
  if (h !== null) {
    const t = h.trim();
    if (/^\d+$/.test(t)) return Number(t) * 1000;
    const date = Date.parse(t);
    if (!Number.isNaN(date)) return Math.max(0, date - nowMs);
  }
  return undefined;
}

/** An item error of a batch answer, as the single-item RPC would have thrown it. */
export function itemError(code: number, message: string): ConnectError {
  const known = Code[code] !== undefined && code !== 0;
  return new ConnectError(message, known ? (code as Code) : Code.Unknown);
}
