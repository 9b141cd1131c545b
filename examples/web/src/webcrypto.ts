// The browser's own cryptography (WebCrypto), used by the page to make inputs for the service and
// to check its answers independently: an Ed25519 signature to verify, an X25519 key pair whose
// shared secret with the server's key the page computes too, and AES-256-GCM envelopes in the
// service's format (proto/offload/v1/aead.proto) sealed and opened here.
//
// WebCrypto runs only in a secure context (https, or http on 127.0.0.1 / localhost); Ed25519 and
// X25519 need Chromium 133+, Firefox 130+ or Safari 17+.

const encoder = new TextEncoder();

export function utf8(s: string): Uint8Array {
  return encoder.encode(s);
}

export function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

export function randomBytes(n: number): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(n));
}

export function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

function subtle(): SubtleCrypto {
  if (!globalThis.crypto?.subtle) {
    throw new Error("WebCrypto is not available: open the page over https or from 127.0.0.1 / localhost");
  }
  return crypto.subtle;
}

async function supported<T>(algorithm: string, f: () => Promise<T>): Promise<T> {
  try {
    return await f();
  } catch (e) {
    throw new Error(`this browser's WebCrypto cannot do ${algorithm}: ${String(e)}`);
  }
}

export interface SignedMessage {
  publicKey: Uint8Array; // raw 32 bytes
  message: Uint8Array;
  signature: Uint8Array; // 64 bytes R || S
}

// A fresh Ed25519 key pair signs `message`; the private key never leaves this function.
export async function ed25519Sign(message: Uint8Array): Promise<SignedMessage> {
  return supported("Ed25519", async () => {
    const pair = (await subtle().generateKey({ name: "Ed25519" }, true, ["sign", "verify"])) as CryptoKeyPair;
    const publicKey = new Uint8Array(await subtle().exportKey("raw", pair.publicKey));
    const signature = new Uint8Array(await subtle().sign({ name: "Ed25519" }, pair.privateKey, message));
    return { publicKey, message, signature };
  });
}

export interface X25519Pair {
  publicKey: Uint8Array; // raw 32 bytes, sent to the server as the peer key
  privateKey: CryptoKey; // not extractable
}

export async function x25519Generate(): Promise<X25519Pair> {
  return supported("X25519", async () => {
    const pair = (await subtle().generateKey({ name: "X25519" }, false, ["deriveBits"])) as CryptoKeyPair;
    const publicKey = new Uint8Array(await subtle().exportKey("raw", pair.publicKey));
    return { publicKey, privateKey: pair.privateKey };
  });
}

// The raw 32-byte X25519 shared secret of `own` and the peer public key `peer`.
export async function x25519Shared(own: X25519Pair, peer: Uint8Array): Promise<Uint8Array> {
  const peerKey = await subtle().importKey("raw", peer, { name: "X25519" }, false, []);
  return new Uint8Array(await subtle().deriveBits({ name: "X25519", public: peerKey }, own.privateKey, 256));
}

// AES-256-GCM in the service's envelope: 0x01, key version (u32 big-endian), 12-byte nonce,
// ciphertext, 16-byte tag. The header is not associated data (aead.proto).
const kEnvelopeFormat = 0x01;
const kNonceBytes = 12;
const kHeaderBytes = 1 + 4 + kNonceBytes;
const kTagBytes = 16;

export async function aesKey(raw: Uint8Array): Promise<CryptoKey> {
  return subtle().importKey("raw", raw, { name: "AES-GCM" }, false, ["encrypt", "decrypt"]);
}

export async function aesSealEnvelope(
  key: CryptoKey,
  keyVersion: number,
  plaintext: Uint8Array,
  associatedData: Uint8Array,
): Promise<Uint8Array> {
  const nonce = randomBytes(kNonceBytes);
  const sealed = new Uint8Array(
    await subtle().encrypt({ name: "AES-GCM", iv: nonce, additionalData: associatedData, tagLength: 128 }, key, plaintext),
  );
  const envelope = new Uint8Array(kHeaderBytes + sealed.length);
  envelope[0] = kEnvelopeFormat;
  new DataView(envelope.buffer).setUint32(1, keyVersion, false);
  envelope.set(nonce, 5);
  envelope.set(sealed, kHeaderBytes);
  return envelope;
}

// Opens an envelope made by the service (or by aesSealEnvelope); throws if it does not
// authenticate. Returns the key version written in its header with the plaintext.
export async function aesOpenEnvelope(
  key: CryptoKey,
  envelope: Uint8Array,
  associatedData: Uint8Array,
): Promise<{ keyVersion: number; plaintext: Uint8Array }> {
  if (envelope.length < kHeaderBytes + kTagBytes || envelope[0] !== kEnvelopeFormat) {
    throw new Error(`not an AES-256-GCM envelope of format 1 (${envelope.length} bytes)`);
  }
  const keyVersion = new DataView(envelope.buffer, envelope.byteOffset).getUint32(1, false);
  const plaintext = new Uint8Array(
    await subtle().decrypt(
      { name: "AES-GCM", iv: envelope.subarray(5, kHeaderBytes), additionalData: associatedData, tagLength: 128 },
      key,
      envelope.subarray(kHeaderBytes),
    ),
  );
  return { keyVersion, plaintext };
}
