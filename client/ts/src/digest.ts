// Memo keys: a SHA-256 digest of a random salt (one per client) and the framed inputs, so that a
// memo never holds the raw inputs (envelopes, messages, peer keys) as its keys and two different
// inputs never share a key by concatenation. The same scheme as the server's memos (a keyed hash
// with a random salt), on the platform's WebCrypto where there is one.
//
// Where a platform has no WebCrypto (React Native), the caller passes `CryptoProvider` functions
// (e.g. from react-native-quick-crypto or expo-crypto): a SHA-256 and a secure random source.

/** The two functions the memos need. Both must be cryptographically sound. */
export interface CryptoProvider {
  /** SHA-256 of `data` (32 bytes). */
  sha256(data: Uint8Array): Promise<Uint8Array> | Uint8Array;
  /** `n` bytes from a cryptographically secure random source. */
  randomBytes(n: number): Uint8Array;
}

interface SubtleLike {
  subtle: { digest(algorithm: string, data: Uint8Array): Promise<ArrayBuffer> };
  getRandomValues<T extends ArrayBufferView>(array: T): T;
}

function fromWebCrypto(c: SubtleLike): CryptoProvider {
  return {
    sha256: async (data) => new Uint8Array(await c.subtle.digest("SHA-256", data)),
    randomBytes: (n) => c.getRandomValues(new Uint8Array(n)),
  };
}

/**
 * The platform's WebCrypto as a `CryptoProvider`: `globalThis.crypto` (browsers, Node 19+, Deno,
 * Bun), else Node 18's `require("node:crypto").webcrypto`, which Node 18 does not put on
 * globalThis. Throws where there is neither (React Native): pass `crypto` in the options there.
 */
export async function platformCrypto(): Promise<CryptoProvider> {
  const g = (globalThis as { crypto?: Partial<SubtleLike> }).crypto;
  if (g?.subtle && typeof g.getRandomValues === "function") return fromWebCrypto(g as SubtleLike);
  const proc = (globalThis as { process?: { versions?: { node?: string } } }).process;
  if (proc?.versions?.node) {
    // A computed specifier: bundlers for browsers and React Native leave it alone.
    const specifier = "node:crypto";
    const m = (await import(/* @vite-ignore */ specifier)) as { webcrypto?: SubtleLike };
    if (m.webcrypto?.subtle) return fromWebCrypto(m.webcrypto);
  }
  throw new Error(
    "crypto-offload client: this platform has no WebCrypto (React Native?): pass " +
      "`crypto: { sha256, randomBytes }` in the client options (docs/mobile.md)",
  );
}

const encoder = new TextEncoder();

/** Salted, framed SHA-256 digests: `digest(tag, fields...)` -> a 43-character base64url string. */
export class Digester {
  private constructor(
    private readonly provider: CryptoProvider,
    private readonly salt: Uint8Array,
  ) {}

  /** A digester with a fresh 32-byte random salt from `provider`. */
  static create(provider: CryptoProvider): Digester {
    const salt = provider.randomBytes(32);
    if (!(salt instanceof Uint8Array) || salt.length !== 32) {
      throw new Error("crypto-offload client: crypto.randomBytes(32) must return 32 bytes");
    }
    return new Digester(provider, salt);
  }

  /** The digest of the salt, `tag` and each field, each preceded by its length (4 bytes). */
  async digest(tag: string, ...fields: (Uint8Array | string | number)[]): Promise<string> {
    const parts: Uint8Array[] = [this.salt, encoder.encode(tag)];
    for (const f of fields) {
      if (typeof f === "number") {
        // Never wrapped (f >>> 0): two different numbers must never share a digest.
        if (!(Number.isInteger(f) && f >= 0 && f <= 0xffffffff)) {
          throw new RangeError(`crypto-offload client: digest field: expected an integer from 0 to 4294967295, got ${f}`);
        }
        const b = new Uint8Array(4);
        new DataView(b.buffer).setUint32(0, f, false);
        parts.push(b);
      } else {
        parts.push(typeof f === "string" ? encoder.encode(f) : f);
      }
    }
    let total = 0;
    for (const p of parts) total += 4 + p.length;
    const buf = new Uint8Array(total);
    const view = new DataView(buf.buffer);
    let at = 0;
    for (const p of parts) {
      view.setUint32(at, p.length, false);
      buf.set(p, at + 4);
      at += 4 + p.length;
    }
    const d = await this.provider.sha256(buf);
    buf.fill(0); // it held the inputs (an envelope, a message)
    if (!(d instanceof Uint8Array) || d.length !== 32) {
      throw new Error("crypto-offload client: crypto.sha256 must return 32 bytes");
    }
    return toBase64Url(d);
  }
}

// One flat string: a key built by `+=` would be a rope of a dozen string objects, each of which
// a memo entry would hold for its whole life (several hundred bytes instead of one 43-character
// string).
function toBase64Url(bytes: Uint8Array): string {
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const codes: number[] = [];
  const put = (six: number) => codes.push(alphabet.charCodeAt(six));
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    put(n >> 18);
    put((n >> 12) & 63);
    put((n >> 6) & 63);
    put(n & 63);
  }
  if (i < bytes.length) {
    const n = (bytes[i] << 16) | ((bytes[i + 1] ?? 0) << 8);
    put(n >> 18);
    put((n >> 12) & 63);
    if (i + 1 < bytes.length) put((n >> 6) & 63);
  }
  return String.fromCharCode(...codes);
}
