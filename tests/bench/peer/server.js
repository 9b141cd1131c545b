// The benchmark peer: the server a user would write instead of crypto-offload, in Node.js with
// @grpc/grpc-js, @grpc/proto-loader and node:crypto, serving the same proto (proto/offload/v1) for
// the benchmarked calls:
//   Ed25519Service.Verify / BatchVerify, X25519Service.Derive / BatchDerive (raw output),
//   AeadService.Open / BatchOpen (ChaCha20-Poly1305 and AES-256-GCM keys, our envelope:
//   0x01 | key version u32 BE | 12-byte nonce | ciphertext | 16-byte tag),
//   KeyService.CreateKey / ImportKey / GetKey / ListKeys / DeleteKey (keys in memory, version 1).
// Anything else answers UNIMPLEMENTED (grpc-js does that for methods without a handler).
//
//   node server.js --mode=cached --address=127.0.0.1:0     # prints {"event":"peer_started",...}
//
// --mode=cached  key objects are made once: a managed key's KeyObject at create/import time, and
//                callers' public keys (Ed25519 verify keys, X25519 peers) in a bounded map;
// --mode=parse   every call parses its keys again (createPublicKey / createPrivateKey /
//                createSecretKey from the raw bytes), as a straightforward handler does.
// No memo: every call does its crypto. Node runs the handlers on one thread (node:crypto's
// synchronous calls), which is how such a server is usually written.
// Checks follow the proto: sizes first (INVALID_ARGUMENT naming the field), unknown key NOT_FOUND,
// wrong key type FAILED_PRECONDITION, one bad batch item never fails the batch. Ed25519 verify is
// node:crypto's (OpenSSL) as is: without the small-order checks of our policy, i.e. if anything
// less work than ours.
'use strict';

const crypto = require('node:crypto');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const KEY_TYPE = { ED25519: 1, X25519: 2, CHACHA20_POLY1305: 3, XCHACHA20_POLY1305: 4, AES256_GCM: 5 };
const DERIVE_OUTPUT = { UNSPECIFIED: 0, RAW: 1, BOX_BEFORENM: 2 };
const MAX_BATCH_ITEMS = 1024;
const MAX_MESSAGE_BYTES = 16 << 20;
const KEY_ID = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const PUBLIC_KEY_CACHE_ENTRIES = 1 << 16;

// DER prefixes that turn raw 32-byte keys into SPKI / PKCS#8 (RFC 8410).
const DER = {
  ed25519Spki: Buffer.from('302a300506032b6570032100', 'hex'),
  ed25519Pkcs8: Buffer.from('302e020100300506032b657004220420', 'hex'),
  x25519Spki: Buffer.from('302a300506032b656e032100', 'hex'),
  x25519Pkcs8: Buffer.from('302e020100300506032b656e04220420', 'hex'),
};

function parseArgs(argv) {
  const args = { mode: 'cached', address: '127.0.0.1:0', proto_dir: path.resolve(__dirname, '../../../proto') };
  for (const a of argv) {
    const m = /^--([a-z_]+)=(.*)$/.exec(a);
    if (!m || !(m[1] in args)) throw new Error(`unknown argument ${a} (--mode, --address, --proto_dir)`);
    args[m[1]] = m[2];
  }
  if (args.mode !== 'cached' && args.mode !== 'parse') {
    throw new Error(`--mode: expected cached or parse, got ${args.mode}`);
  }
  if (!/^(127\.0\.0\.1|\[::1\]|localhost):\d+$/.test(args.address)) {
    throw new Error(`--address: expected a loopback address (127.0.0.1:port), got ${args.address}`);
  }
  return args;
}

class RpcError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}
const invalid = (msg) => new RpcError(grpc.status.INVALID_ARGUMENT, msg);

function checkSize(buf, field, size) {
  const n = buf ? buf.length : 0;
  if (n !== size) throw invalid(`${field}: expected ${size} bytes, got ${n}`);
}

// A bounded map of raw key bytes -> KeyObject (cleared when full: enough for a benchmark peer).
class KeyObjectCache {
  constructor(make) {
    this.make = make;
    this.map = new Map();
  }
  get(raw) {
    const k = raw.toString('latin1');
    let obj = this.map.get(k);
    if (obj === undefined) {
      obj = this.make(raw);
      if (this.map.size >= PUBLIC_KEY_CACHE_ENTRIES) this.map.clear();
      this.map.set(k, obj);
    }
    return obj;
  }
}

function makePeer(mode) {
  const cached = mode === 'cached';
  const keys = new Map();  // key_id -> record

  const ed25519Public = (raw) =>
    crypto.createPublicKey({ key: Buffer.concat([DER.ed25519Spki, raw]), format: 'der', type: 'spki' });
  const x25519Public = (raw) =>
    crypto.createPublicKey({ key: Buffer.concat([DER.x25519Spki, raw]), format: 'der', type: 'spki' });
  const x25519Private = (raw) =>
    crypto.createPrivateKey({ key: Buffer.concat([DER.x25519Pkcs8, raw]), format: 'der', type: 'pkcs8' });
  const ed25519Private = (raw) =>
    crypto.createPrivateKey({ key: Buffer.concat([DER.ed25519Pkcs8, raw]), format: 'der', type: 'pkcs8' });
  const edCache = new KeyObjectCache(ed25519Public);
  const xCache = new KeyObjectCache(x25519Public);
  const verifyKey = cached ? (raw) => edCache.get(raw) : ed25519Public;
  const peerKey = cached ? (raw) => xCache.get(raw) : x25519Public;

  // Keys ------------------------------------------------------------------------------------

  function rawPublic(privateKey) {
    return Buffer.from(crypto.createPublicKey(privateKey).export({ format: 'jwk' }).x, 'base64url');
  }

  function newRecord(id, type, secret, options) {
    const rec = { id, type, secret, publicKey: Buffer.alloc(0), options: options || {},
                  created: Math.floor(Date.now() / 1000), object: null };
    if (type === KEY_TYPE.ED25519) {
      rec.object = ed25519Private(secret);
      rec.publicKey = rawPublic(rec.object);
    } else if (type === KEY_TYPE.X25519) {
      rec.object = x25519Private(secret);
      rec.publicKey = rawPublic(rec.object);
    } else {
      rec.object = crypto.createSecretKey(secret);
    }
    if (!cached) rec.object = null;  // parse mode keeps only the raw secret
    return rec;
  }

  function keyInfo(rec) {
    return {
      key_id: rec.id, type: rec.type, current_version: 1,
      versions: [{ version: 1, public_key: rec.publicKey, created_unix_seconds: rec.created }],
      options: rec.options,
    };
  }

  function checkNewKey(req) {
    if (!KEY_ID.test(req.key_id || '')) throw invalid(`key_id: expected [a-z0-9][a-z0-9._-]{0,63}, got "${req.key_id || ''}"`);
    if (!(req.type >= 1 && req.type <= 5)) throw invalid(`type: unknown key type ${req.type}`);
    if (req.type === KEY_TYPE.XCHACHA20_POLY1305) {
      throw new RpcError(grpc.status.UNIMPLEMENTED, 'type: node:crypto has no XChaCha20-Poly1305');
    }
    if (keys.has(req.key_id)) throw new RpcError(grpc.status.ALREADY_EXISTS, `key ${req.key_id} exists`);
  }

  function createKey(req) {
    checkNewKey(req);
    let secret;
    if (req.type === KEY_TYPE.ED25519 || req.type === KEY_TYPE.X25519) {
      const { privateKey } = crypto.generateKeyPairSync(req.type === KEY_TYPE.ED25519 ? 'ed25519' : 'x25519');
      secret = Buffer.from(privateKey.export({ format: 'jwk' }).d, 'base64url');
    } else {
      secret = crypto.randomBytes(32);
    }
    const rec = newRecord(req.key_id, req.type, secret, req.options);
    keys.set(rec.id, rec);
    return keyInfo(rec);
  }

  function importKey(req) {
    checkNewKey(req);
    let secret = req.secret || Buffer.alloc(0);
    if (req.type === KEY_TYPE.ED25519 && secret.length === 64) {
      const seed = secret.subarray(0, 32);
      if (!rawPublic(ed25519Private(seed)).equals(secret.subarray(32))) {
        throw invalid('secret: the public half does not match the seed');
      }
      secret = seed;
    }
    checkSize(secret, 'secret', 32);
    const rec = newRecord(req.key_id, req.type, Buffer.from(secret), req.options);
    keys.set(rec.id, rec);
    return keyInfo(rec);
  }

  function findKey(id, types, what) {
    const rec = keys.get(id || '');
    if (!rec) throw new RpcError(grpc.status.NOT_FOUND, `key ${id || ''} not found`);
    if (!types.includes(rec.type)) {
      throw new RpcError(grpc.status.FAILED_PRECONDITION, `key ${id}: type ${rec.type} cannot ${what}`);
    }
    return rec;
  }

  // Operations -------------------------------------------------------------------------------

  function verify(req) {
    checkSize(req.public_key, 'public_key', 32);
    checkSize(req.signature, 'signature', 64);
    let valid;
    try {
      valid = crypto.verify(null, req.message || Buffer.alloc(0), verifyKey(req.public_key), req.signature);
    } catch (e) {
      valid = false;  // a public key OpenSSL cannot decode
    }
    return { valid, memo_hit: false };
  }

  function derive(req) {
    const rec = findKey(req.key_id, [KEY_TYPE.X25519], 'derive');
    if (req.key_version !== 0 && req.key_version !== undefined && req.key_version !== 1) {
      throw new RpcError(grpc.status.NOT_FOUND, `key ${rec.id}: no version ${req.key_version}`);
    }
    checkSize(req.peer_public_key, 'peer_public_key', 32);
    const output = req.output || DERIVE_OUTPUT.UNSPECIFIED;
    if (output !== DERIVE_OUTPUT.RAW && output !== DERIVE_OUTPUT.UNSPECIFIED) {
      throw new RpcError(grpc.status.UNIMPLEMENTED, 'output: node:crypto has no HSalsa20 (box beforenm)');
    }
    const privateKey = cached ? rec.object : x25519Private(rec.secret);
    let shared;
    try {
      shared = crypto.diffieHellman({ privateKey, publicKey: peerKey(req.peer_public_key) });
    } catch (e) {
      throw invalid('small-order peer public key');  // OpenSSL refuses an all-zero secret
    }
    return { shared_key: shared, key_version: 1, memo_hit: false };
  }

  function open(req) {
    const rec = findKey(req.key_id, [KEY_TYPE.CHACHA20_POLY1305, KEY_TYPE.AES256_GCM], 'open');
    const env = req.envelope || Buffer.alloc(0);
    if (env.length < 5 + 12 + 16) throw invalid(`envelope: expected at least 33 bytes, got ${env.length}`);
    if (env[0] !== 0x01) throw invalid(`envelope: unknown format version ${env[0]}`);
    const version = env.readUInt32BE(1);
    if (version !== 1) throw new RpcError(grpc.status.NOT_FOUND, `key ${rec.id}: no version ${version}`);
    const nonce = env.subarray(5, 17);
    const ct = env.subarray(17, env.length - 16);
    const tag = env.subarray(env.length - 16);
    const key = cached ? rec.object : crypto.createSecretKey(rec.secret);
    const algorithm = rec.type === KEY_TYPE.AES256_GCM ? 'aes-256-gcm' : 'chacha20-poly1305';
    const decipher = crypto.createDecipheriv(algorithm, key, nonce, { authTagLength: 16 });
    decipher.setAAD(req.associated_data || Buffer.alloc(0), { plaintextLength: ct.length });
    decipher.setAuthTag(tag);
    const head = decipher.update(ct);
    let tail;
    try {
      tail = decipher.final();
    } catch (e) {
      throw invalid('authentication failed');
    }
    return { plaintext: tail.length ? Buffer.concat([head, tail]) : head, key_version: 1, memo_hit: false };
  }

  // gRPC glue --------------------------------------------------------------------------------

  function unary(fn) {
    return (call, callback) => {
      let resp;
      try {
        resp = fn(call.request);
      } catch (e) {
        if (e instanceof RpcError) return callback({ code: e.code, details: e.message });
        return callback({ code: grpc.status.INTERNAL, details: 'internal error' });
      }
      callback(null, resp);
    };
  }

  // A batch handler: one result per item; `wrap` puts the item's response into its result.
  function batch(fn, wrap) {
    return unary((req) => {
      const items = req.items || [];
      if (items.length === 0) throw invalid('items: expected at least 1 item, got 0');
      if (items.length > MAX_BATCH_ITEMS) throw invalid(`items: expected at most ${MAX_BATCH_ITEMS}, got ${items.length}`);
      const results = new Array(items.length);
      for (let i = 0; i < items.length; ++i) {
        try {
          results[i] = wrap(fn(items[i]));
        } catch (e) {
          const code = e instanceof RpcError ? e.code : grpc.status.INTERNAL;
          results[i] = { status: { code, message: e instanceof RpcError ? e.message : 'internal error' } };
        }
      }
      return { results };
    });
  }
  const nested = (resp) => ({ status: { code: 0 }, response: resp });

  return {
    keys: {
      CreateKey: unary(createKey),
      ImportKey: unary(importKey),
      GetKey: unary((req) => keyInfo(findKey(req.key_id, [1, 2, 3, 4, 5], 'be read'))),
      ListKeys: unary(() => ({ keys: [...keys.values()].map(keyInfo) })),
      DeleteKey: unary((req) => {
        findKey(req.key_id, [1, 2, 3, 4, 5], 'be deleted');
        keys.delete(req.key_id);
        return {};
      }),
    },
    ed25519: {
      Verify: unary(verify),
      BatchVerify: batch(verify, (r) => ({ status: { code: 0 }, valid: r.valid, memo_hit: false })),
    },
    x25519: { Derive: unary(derive), BatchDerive: batch(derive, nested) },
    aead: { Open: unary(open), BatchOpen: batch(open, nested) },
  };
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const definition = protoLoader.loadSync(
    ['offload/v1/keys.proto', 'offload/v1/ed25519.proto', 'offload/v1/x25519.proto', 'offload/v1/aead.proto'],
    { includeDirs: [args.proto_dir], keepCase: true, longs: Number, defaults: true });
  const v1 = grpc.loadPackageDefinition(definition).offload.v1;
  const peer = makePeer(args.mode);
  const server = new grpc.Server({
    'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
    'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
  });
  server.addService(v1.KeyService.service, peer.keys);
  server.addService(v1.Ed25519Service.service, peer.ed25519);
  server.addService(v1.X25519Service.service, peer.x25519);
  server.addService(v1.AeadService.service, peer.aead);
  server.bindAsync(args.address, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) {
      console.error(JSON.stringify({ event: 'peer_failed', error: err.message }));
      process.exit(1);
    }
    console.log(JSON.stringify({ event: 'peer_started', grpc_port: port, mode: args.mode,
                                 node: process.version, openssl: process.versions.openssl }));
  });
  const stop = () => {
    const force = setTimeout(() => { server.forceShutdown(); process.exit(0); }, 5000);
    server.tryShutdown(() => { clearTimeout(force); process.exit(0); });
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

try {
  main();
} catch (e) {
  console.error(JSON.stringify({ event: 'peer_failed', error: e.message }));
  process.exit(2);
}
