// A least-recently-used memo bounded in bytes, with a maximum age: the building block of the
// client's open, derive and verify memos.
//
// - One recency order over every key id's entries and one byte budget: a hit moves the entry to
//   the newest end, an insert evicts from the oldest end until the budget holds. An entry larger
//   than the whole budget is not kept.
// - `maxAgeMs` (when set): an entry that old or older (from its insert; hits do not renew it) is
//   never used: every lookup and insert first wipes and drops the entries past it (the oldest
//   inserts first), counted as expired. Its age is read on two clocks, and the older reading
//   wins: the monotonic `now` (performance.now, which stops while a device sleeps in Node and
//   in many browsers, so a phone resumed after an hour would still find its entries young) and
//   the wall clock `wallNow` (Date.now, which counts the sleep, but may be set back). A clock
//   that went back past an entry's stamp makes it expired too: its age is then unknown.
// - `dropKey(keyId)` removes every entry of that key at once (a refusal about the key), and
//   bumps the key's generation, so that an answer already on its way for that key is not kept;
//   `clear()` does the same for every key.
// - Secret values are wiped (`wipe`) whenever an entry leaves: evicted, expired, dropped,
//   replaced or cleared.
// Single-threaded (JavaScript): no locking.

/** A memo's counters, as `OffloadClient.stats()` reports them. */
export interface MemoStats {
  /** Lookups answered from the memo (no request). */
  hits: number;
  /** Lookups that found nothing usable (absent or too old). */
  misses: number;
  /** Request payload bytes that hits kept off the network (envelopes, associated data, peer keys, messages). */
  bytesNotSent: number;
  /** Response payload bytes that hits did not have to receive (plaintexts, shared keys). */
  bytesNotReceived: number;
  /** Entries pushed out by the byte budget. */
  evictions: number;
  /** Entries past the maximum age (never used; wiped by the next lookup or insert). */
  expired: number;
  /** Entries dropped because the server refused their key. */
  droppedForKey: number;
  /** Entries held now, and the bytes charged for them. */
  entries: number;
  bytes: number;
  /** The byte budget, and the maximum age (null: none). */
  maxBytes: number;
  maxAgeMs: number | null;
}

/**
 * What an entry costs besides its value and its key id's characters: the digest string, the
 * entry record and its places in the recency, age and per-key maps (measured on V8: about 250
 * bytes; test "a full memo's memory").
 */
export const kEntryOverheadBytes = 256;
/**
 * What a value holding one Uint8Array costs besides the array's bytes: the object holding it, the
 * Uint8Array and its ArrayBuffer (measured on V8: about 270 bytes).
 */
export const kByteArrayOverheadBytes = 272;

interface Clocks {
  mono: number;
  wall: number;
}

interface Entry<V> {
  keyId: string;
  value: V;
  bytes: number;
  createdMs: number; // on `now`
  createdWallMs: number; // on `wallNow`
}

export interface MemoOptions<V> {
  maxBytes: number;
  /** Entries older than this are never used; undefined: no age limit (verify results). */
  maxAgeMs?: number;
  /** Milliseconds of a monotonic clock (performance.now). */
  now: () => number;
  /** Milliseconds of the wall clock, which counts a device's sleep (default Date.now). */
  wallNow?: () => number;
  /** Bytes charged for a value (plus kEntryOverheadBytes and the key id). */
  size: (v: V) => number;
  /** Zero-fills a value's secret bytes. */
  wipe: (v: V) => void;
}

export class Memo<V> {
  private readonly entries = new Map<string, Entry<V>>(); // least recently used first (Map insertion order)
  private readonly byAge = new Map<string, Entry<V>>(); // oldest insert first: the order they expire in
  private readonly byKey = new Map<string, Set<string>>();
  private readonly generations = new Map<string, number>();
  private clears = 0; // added to every key's generation: clear() moves them all on
  private bytes = 0;
  private readonly counters = {
    hits: 0,
    misses: 0,
    bytesNotSent: 0,
    bytesNotReceived: 0,
    evictions: 0,
    expired: 0,
    droppedForKey: 0,
  };

  constructor(private readonly options: MemoOptions<V>) {
    if (!(options.maxBytes > 0)) throw new Error(`memo maxBytes: expected > 0, got ${options.maxBytes}`);
    if (options.maxAgeMs !== undefined && !(options.maxAgeMs > 0)) {
      throw new Error(`memo maxAgeMs: expected > 0, got ${options.maxAgeMs}`);
    }
  }

  /**
   * The value under `digest`, or undefined. A hit moves the entry to the newest end and adds
   * `sent` / `received` to the bytes the memo saved.
   */
  get(digest: string, sent: number, received: (v: V) => number): V | undefined {
    const now = this.clocks();
    this.sweep(now);
    const e = this.entries.get(digest);
    if (e === undefined) {
      this.counters.misses++;
      return undefined;
    }
    if (this.expired(e, now)) {
      // Behind a younger one in the age order: only a clock that went back does that.
      this.remove(digest, e);
      this.counters.expired++;
      this.counters.misses++;
      return undefined;
    }
    this.entries.delete(digest);
    this.entries.set(digest, e); // the newest end
    this.counters.hits++;
    this.counters.bytesNotSent += sent;
    this.counters.bytesNotReceived += received(e.value);
    return e.value;
  }

  /** The key's generation: pass it back to `put` so that a drop in between wins. */
  generation(keyId: string): number {
    return (this.generations.get(keyId) ?? 0) + this.clears;
  }

  /**
   * Keeps `value` under `digest` (replacing and wiping an older value), then evicts the least
   * recently used entries until the budget holds. Not kept (and wiped) when larger than the
   * budget, or when `keyId` was dropped since `generation` was read.
   */
  put(digest: string, keyId: string, value: V, generation: number): void {
    const bytes = this.options.size(value) + kEntryOverheadBytes + keyId.length;
    if (bytes > this.options.maxBytes || generation !== this.generation(keyId)) {
      this.options.wipe(value);
      return;
    }
    const now = this.clocks();
    this.sweep(now);
    const old = this.entries.get(digest);
    if (old !== undefined) this.remove(digest, old);
    const entry = { keyId, value, bytes, createdMs: now.mono, createdWallMs: now.wall };
    this.entries.set(digest, entry);
    this.byAge.set(digest, entry);
    let set = this.byKey.get(keyId);
    if (set === undefined) this.byKey.set(keyId, (set = new Set()));
    set.add(digest);
    this.bytes += bytes;
    while (this.bytes > this.options.maxBytes) {
      const [oldestDigest, oldest] = this.entries.entries().next().value as [string, Entry<V>];
      this.remove(oldestDigest, oldest);
      this.counters.evictions++;
    }
  }

  /** Wipes and removes every entry of `keyId`; answers already under way for it are not kept. */
  dropKey(keyId: string): number {
    this.generations.set(keyId, (this.generations.get(keyId) ?? 0) + 1);
    const set = this.byKey.get(keyId);
    if (set === undefined) return 0;
    let n = 0;
    for (const digest of [...set]) {
      const e = this.entries.get(digest);
      if (e !== undefined) {
        this.remove(digest, e);
        n++;
      }
    }
    this.counters.droppedForKey += n;
    return n;
  }

  /** Wipes and removes every entry. */
  clear(): void {
    for (const [digest, e] of [...this.entries]) this.remove(digest, e);
    // Past every generation handed out so far (per key, a drop count plus `clears`), for every
    // key id, dropped before or not; the per-key counts can then start again.
    let most = 0;
    for (const n of this.generations.values()) most = Math.max(most, n);
    this.clears += most + 1;
    this.generations.clear();
  }

  stats(): MemoStats {
    return {
      ...this.counters,
      entries: this.entries.size,
      bytes: this.bytes,
      maxBytes: this.options.maxBytes,
      maxAgeMs: this.options.maxAgeMs ?? null,
    };
  }

  private clocks(): Clocks {
    return { mono: this.options.now(), wall: (this.options.wallNow ?? Date.now)() };
  }

  // Wipes and drops the entries past the maximum age at `now`, or stamped after it (a clock
  // that went back), oldest inserts first.
  private sweep(now: Clocks): void {
    if (this.options.maxAgeMs === undefined) return;
    for (const [digest, e] of this.byAge) {
      if (!this.expired(e, now)) break;
      this.remove(digest, e);
      this.counters.expired++;
    }
  }

  // Past the maximum age on either clock, or on one that went back past the entry's stamp.
  private expired(e: Entry<V>, now: Clocks): boolean {
    const maxAge = this.options.maxAgeMs;
    if (maxAge === undefined) return false;
    const monoAge = now.mono - e.createdMs;
    const wallAge = now.wall - e.createdWallMs;
    return !(monoAge >= 0 && monoAge < maxAge && wallAge >= 0 && wallAge < maxAge);
  }

  private remove(digest: string, e: Entry<V>): void {
    this.entries.delete(digest);
    this.byAge.delete(digest);
    const set = this.byKey.get(e.keyId);
    if (set !== undefined) {
      set.delete(digest);
      if (set.size === 0) this.byKey.delete(e.keyId);
    }
    this.bytes -= e.bytes;
    this.options.wipe(e.value);
  }
}
