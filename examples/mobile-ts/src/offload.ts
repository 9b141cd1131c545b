// A small typed facade over the generated clients: what a mobile or web app keeps in one file.
// The transport decides the wire: Connect (JSON or binary) or gRPC-Web, over the HTTP port.
import type { Transport } from "@connectrpc/connect";
import { Code, ConnectError, createClient } from "@connectrpc/connect";

import { AeadService } from "./gen/offload/v1/aead_pb.js";
import { KeyService, KeyType } from "./gen/offload/v1/keys_pb.js";
import { DeriveOutput, X25519Service } from "./gen/offload/v1/x25519_pb.js";

export class Offload {
  private readonly keys;
  private readonly x25519;
  private readonly aead;

  constructor(transport: Transport) {
    this.keys = createClient(KeyService, transport);
    this.x25519 = createClient(X25519Service, transport);
    this.aead = createClient(AeadService, transport);
  }

  // Creates `keyId` unless it exists (an admin step; apps usually get keys provisioned).
  async ensureKey(keyId: string, type: KeyType): Promise<void> {
    try {
      await this.keys.createKey({ keyId, type });
    } catch (e) {
      if (!(e instanceof ConnectError && e.code === Code.AlreadyExists)) throw e;
    }
  }

  // The NaCl box key shared by the server's X25519 key `keyId` and `peer`. The server remembers
  // it: a second call for the same peer is a memo hit (no curve operation).
  async boxKey(keyId: string, peer: Uint8Array): Promise<{ key: Uint8Array; memoHit: boolean }> {
    const r = await this.x25519.derive(
      { keyId, peerPublicKey: peer, output: DeriveOutput.BOX_BEFORENM },
      { timeoutMs: 2000, headers: { "x-offload-key": keyId } },
    );
    return { key: r.sharedKey, memoHit: r.memoHit };
  }

  async seal(keyId: string, plaintext: Uint8Array, associatedData?: Uint8Array): Promise<Uint8Array> {
    const r = await this.aead.seal({ keyId, plaintext, associatedData }, { timeoutMs: 2000 });
    return r.envelope;
  }

  // Decrypts an envelope; repeated envelopes are answered from the server's open memo.
  async open(keyId: string, envelope: Uint8Array, associatedData?: Uint8Array) {
    const r = await this.aead.open({ keyId, envelope, associatedData }, { timeoutMs: 2000 });
    return { plaintext: r.plaintext, memoHit: r.memoHit };
  }

  // Many envelopes in one round trip; one bad envelope fails only its own item.
  async openMany(keyId: string, envelopes: Uint8Array[], associatedData?: Uint8Array) {
    const r = await this.aead.batchOpen({
      items: envelopes.map((envelope) => ({ keyId, envelope, associatedData })),
    });
    return r.results.map((x) =>
      x.status && x.status.code !== 0
        ? { error: `${x.status.code}: ${x.status.message}` }
        : { plaintext: x.response?.plaintext, memoHit: x.response?.memoHit },
    );
  }
}
