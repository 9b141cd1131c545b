"""FFI test: liboffload_c.so from Python through ctypes, against a live offload_server.

Environment (set by CMake): OFFLOAD_C_LIB (the .so), OFFLOAD_SERVER (the binary),
OFFLOAD_E2E_DIR (tests/e2e, whose harness starts servers on free loopback ports).
Results are cross-checked with PyNaCl (libsodium), an implementation independent of the service.
Bearer tokens (offload_client_options_t, offload_client_set_token) against a server that requires
them are minted by PyJWT (python3-jwt with python3-cryptography; skipped without them).
Run with /usr/bin/python3 (Debian's python3-grpcio and python3-nacl).
"""

import base64
import ctypes
import json
import os
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.environ.get("OFFLOAD_E2E_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "e2e")))
import harness  # noqa: E402

import nacl.bindings  # noqa: E402
import nacl.public  # noqa: E402
import nacl.signing  # noqa: E402

try:
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
except ImportError:  # the token tests are skipped
    jwt = None

OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, BUFFER_TOO_SMALL = 0, 3, 5, 6, 100
PERMISSION_DENIED, FAILED_PRECONDITION, UNAUTHENTICATED = 7, 9, 16
ED25519, X25519, XCHACHA = 1, 2, 4
RAW, BOX = 1, 2

u8p = ctypes.POINTER(ctypes.c_uint8)
szp = ctypes.POINTER(ctypes.c_size_t)


class Options(ctypes.Structure):
    """offload_client_options_t, field for field (offload.h)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("endpoints", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("tls_ca_file", ctypes.c_char_p),
        ("tls_ca_pem", ctypes.c_char_p),
        ("tls_cert_file", ctypes.c_char_p),
        ("tls_cert_pem", ctypes.c_char_p),
        ("tls_key_file", ctypes.c_char_p),
        ("tls_key_pem", ctypes.c_char_p),
        ("tls_server_name", ctypes.c_char_p),
        ("bearer_token", ctypes.c_char_p),
        ("verify_memo_bytes", ctypes.c_size_t),
        ("derive_memo_bytes", ctypes.c_size_t),
        ("open_memo_bytes", ctypes.c_size_t),
        ("derive_memo_max_age_ms", ctypes.c_uint32),
        ("open_memo_max_age_ms", ctypes.c_uint32),
    ]

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(Options), **fields)


TLS, NO_VERIFY_MEMO, DERIVE_MEMO, OPEN_MEMO = 1, 2, 4, 8

_MEMO_FIELDS = ["hits", "misses", "inserts", "evictions", "expired", "dropped", "entries",
                "bytes", "capacity_bytes"]


class MemoStats(ctypes.Structure):
    """offload_memo_stats_t."""
    _fields_ = [(name, ctypes.c_uint64) for name in _MEMO_FIELDS]


class Stats(ctypes.Structure):
    """offload_client_stats_t: every field a uint64_t."""
    _fields_ = [(name, ctypes.c_uint64) for name in [
        "struct_size", "calls", "rpcs", "batch_rpcs", "retries", "failed_calls", "auto_batches",
        "auto_batched_items", "retry_info_waits", "memo_bytes_not_sent",
        "memo_bytes_not_received"]] + [
        ("verify_memo", MemoStats), ("derive_memo", MemoStats), ("open_memo", MemoStats)]

    def __init__(self):
        super().__init__(struct_size=ctypes.sizeof(Stats))


def load():
    lib = ctypes.CDLL(os.environ["OFFLOAD_C_LIB"])
    sigs = {
        "offload_last_error": (ctypes.c_char_p, []),
        "offload_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "offload_client_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint32,
                                                  ctypes.POINTER(ctypes.c_void_p)]),
        "offload_client_options_init": (None, [ctypes.POINTER(Options)]),
        "offload_client_create_with_options": (ctypes.c_int, [ctypes.POINTER(Options),
                                                               ctypes.POINTER(ctypes.c_void_p)]),
        "offload_client_set_token": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "offload_client_destroy": (None, [ctypes.c_void_p]),
        "offload_client_get_stats": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(Stats)]),
        "offload_client_reset": (ctypes.c_int, [ctypes.c_void_p]),
        "offload_key_create": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                              u8p, szp]),
        "offload_key_import": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                              ctypes.c_char_p, ctypes.c_size_t, u8p, szp]),
        "offload_key_delete": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "offload_key_schedule_deletion": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                                         ctypes.c_uint64,
                                                         ctypes.POINTER(ctypes.c_int64)]),
        "offload_key_cancel_deletion": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "offload_key_disable": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "offload_key_enable": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
        "offload_verify": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                          ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]),
        "offload_sign": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.c_size_t, u8p, szp, u8p]),
        "offload_derive": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                          ctypes.c_size_t, ctypes.c_int, u8p, szp]),
        "offload_box_seal": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                            ctypes.c_char_p, ctypes.c_size_t, u8p, szp, u8p]),
        "offload_box_open": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                            ctypes.c_char_p, ctypes.c_size_t, u8p, szp]),
        "offload_aead_seal": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                             ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                             u8p, szp]),
        "offload_aead_open": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                             ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                             u8p, szp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


LIB = load()


class OffloadError(Exception):
    def __init__(self, code, message):
        super().__init__("%s: %s" % (LIB.offload_status_name(code).decode(), message))
        self.code = code


def check(code):
    if code != OK:
        raise OffloadError(code, LIB.offload_last_error().decode())


def out_call(fn, *args):
    """Calls fn(*args, buf, &len) with the buffer-too-small protocol; returns the bytes."""
    n = ctypes.c_size_t(0)
    code = fn(*args, None, ctypes.byref(n))  # ask for the size
    if code == OK:
        return b""
    if code != BUFFER_TOO_SMALL:
        check(code)
    buf = (ctypes.c_uint8 * n.value)()
    check(fn(*args, buf, ctypes.byref(n)))
    return bytes(buf[:n.value])


class CtypesTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = harness.Server("ctypes")
        cls.servers = [cls.server]
        cls.server.start()
        handle = ctypes.c_void_p()
        check(LIB.offload_client_create(cls.server.address.encode(), 5000, ctypes.byref(handle)))
        cls.c = handle

    @classmethod
    def tearDownClass(cls):
        LIB.offload_client_destroy(cls.c)
        cls.server.stop()

    def test_create_rejects_bad_endpoints(self):
        handle = ctypes.c_void_p()
        self.assertEqual(LIB.offload_client_create(b"nonsense", 0, ctypes.byref(handle)),
                         INVALID_ARGUMENT)
        self.assertIn(b"host:port", LIB.offload_last_error())
        self.assertIsNone(handle.value)

    def test_sign_verify_against_pynacl(self):
        seed = bytes(range(32))
        pk = (ctypes.c_uint8 * 32)()
        n = ctypes.c_size_t(32)
        check(LIB.offload_key_import(self.c, b"py-ed", ED25519, seed, 32, pk, ctypes.byref(n)))
        signer = nacl.signing.SigningKey(seed)
        self.assertEqual(bytes(pk), bytes(signer.verify_key))
        msg = b"signed through ctypes"
        # The buffer protocol: ask with no room, then sign into a buffer of the size required.
        n = ctypes.c_size_t(0)
        self.assertEqual(LIB.offload_sign(self.c, b"py-ed", msg, len(msg), None, ctypes.byref(n),
                                          None), BUFFER_TOO_SMALL)
        self.assertEqual(n.value, 64)
        buf = (ctypes.c_uint8 * n.value)()
        pk_out = (ctypes.c_uint8 * 32)()
        check(LIB.offload_sign(self.c, b"py-ed", msg, len(msg), buf, ctypes.byref(n), pk_out))
        sig = bytes(buf)
        self.assertEqual(sig, signer.sign(msg).signature)
        self.assertEqual(bytes(pk_out), bytes(pk))
        valid = ctypes.c_int(-1)
        check(LIB.offload_verify(self.c, bytes(pk), 32, msg, len(msg), sig, 64, ctypes.byref(valid)))
        self.assertEqual(valid.value, 1)
        bad = bytes([sig[0] ^ 1]) + sig[1:]
        check(LIB.offload_verify(self.c, bytes(pk), 32, msg, len(msg), bad, 64, ctypes.byref(valid)))
        self.assertEqual(valid.value, 0)
        self.assertEqual(LIB.offload_verify(self.c, bytes(pk), 31, msg, len(msg), sig, 64,
                                            ctypes.byref(valid)), INVALID_ARGUMENT)

    def test_concurrent_verifies_from_python_threads(self):
        signer = nacl.signing.SigningKey(bytes([7]) * 32)
        pk = bytes(signer.verify_key)
        cases = []
        for i in range(64):
            m = b"m%d" % i
            s = signer.sign(m).signature
            cases.append((m, s if i % 2 == 0 else s[:5] + bytes([s[5] ^ 1]) + s[6:]))
        results = [None] * len(cases)

        def run(i):
            v = ctypes.c_int(-1)
            m, s = cases[i]
            code = LIB.offload_verify(self.c, pk, 32, m, len(m), s, 64, ctypes.byref(v))
            results[i] = (code, v.value)

        for t in harness.thread_run(run, len(cases)):
            t.join()
        self.assertEqual(results, [(OK, 1 if i % 2 == 0 else 0) for i in range(len(cases))])

    def test_derive_and_box_against_pynacl(self):
        pk = (ctypes.c_uint8 * 32)()
        n = ctypes.c_size_t(32)
        check(LIB.offload_key_create(self.c, b"py-x", X25519, pk, ctypes.byref(n)))
        service_pk = bytes(pk)
        peer = nacl.public.PrivateKey.generate()
        peer_pk = bytes(peer.public_key)
        raw = out_call(LIB.offload_derive, self.c, b"py-x", peer_pk, 32, RAW)
        self.assertEqual(raw, nacl.bindings.crypto_scalarmult(bytes(peer), service_pk))
        box_key = out_call(LIB.offload_derive, self.c, b"py-x", peer_pk, 32, BOX)
        self.assertEqual(box_key, nacl.bindings.crypto_box_beforenm(service_pk, bytes(peer)))

        box = nacl.public.Box(peer, nacl.public.PublicKey(service_pk))
        msg = b"from python to the service"
        nonce_out = (ctypes.c_uint8 * 24)()
        n = ctypes.c_size_t(256)
        ct = (ctypes.c_uint8 * 256)()
        check(LIB.offload_box_seal(self.c, b"py-x", peer_pk, 32, None, 0, msg, len(msg), ct,
                                   ctypes.byref(n), nonce_out))
        self.assertEqual(box.decrypt(bytes(ct[:n.value]), bytes(nonce_out)), msg)
        sealed = box.encrypt(b"back to the service")
        opened = out_call(LIB.offload_box_open, self.c, b"py-x", peer_pk, 32, sealed.nonce, 24,
                          sealed.ciphertext, len(sealed.ciphertext))
        self.assertEqual(opened, b"back to the service")
        tampered = bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:]
        with self.assertRaises(OffloadError) as e:
            out_call(LIB.offload_box_open, self.c, b"py-x", peer_pk, 32, sealed.nonce, 24,
                     tampered, len(tampered))
        self.assertEqual(e.exception.code, INVALID_ARGUMENT)

    def test_aead_and_key_errors(self):
        check(LIB.offload_key_create(self.c, b"py-aead", XCHACHA, None, None))
        self.assertEqual(LIB.offload_key_create(self.c, b"py-aead", XCHACHA, None, None),
                         ALREADY_EXISTS)
        env = out_call(LIB.offload_aead_seal, self.c, b"py-aead", b"secret state", 12, b"ad", 2)
        self.assertEqual(len(env), 5 + 24 + 12 + 16)
        self.assertEqual(out_call(LIB.offload_aead_open, self.c, b"py-aead", env, len(env),
                                  b"ad", 2), b"secret state")
        small = (ctypes.c_uint8 * 4)()
        n = ctypes.c_size_t(4)
        self.assertEqual(LIB.offload_aead_open(self.c, b"py-aead", env, len(env), b"ad", 2, small,
                                               ctypes.byref(n)), BUFFER_TOO_SMALL)
        self.assertEqual(n.value, 12)
        # Disabled, then scheduled for deletion (the server's 7-day wait): refused meanwhile,
        # back as it was once cancelled.
        n = ctypes.c_size_t(64)
        buf = (ctypes.c_uint8 * 64)()
        check(LIB.offload_key_disable(self.c, b"py-aead"))
        self.assertEqual(LIB.offload_aead_open(self.c, b"py-aead", env, len(env), b"ad", 2, buf,
                                               ctypes.byref(n)), FAILED_PRECONDITION)
        self.assertIn(b"disabled", LIB.offload_last_error())
        check(LIB.offload_key_enable(self.c, b"py-aead"))
        when = ctypes.c_int64(0)
        now = int(time.time())
        check(LIB.offload_key_schedule_deletion(self.c, b"py-aead", 0, ctypes.byref(when)))
        self.assertGreaterEqual(when.value, now + 7 * 24 * 3600)
        self.assertLessEqual(when.value, now + 7 * 24 * 3600 + 120)
        n = ctypes.c_size_t(64)
        self.assertEqual(LIB.offload_aead_open(self.c, b"py-aead", env, len(env), b"ad", 2, buf,
                                               ctypes.byref(n)), FAILED_PRECONDITION)
        self.assertEqual(LIB.offload_key_delete(self.c, b"py-aead"), FAILED_PRECONDITION)
        check(LIB.offload_key_cancel_deletion(self.c, b"py-aead"))
        self.assertEqual(out_call(LIB.offload_aead_open, self.c, b"py-aead", env, len(env),
                                  b"ad", 2), b"secret state")
        check(LIB.offload_key_delete(self.c, b"py-aead"))
        self.assertEqual(LIB.offload_key_delete(self.c, b"py-never"), NOT_FOUND)


def stats(handle):
    st = Stats()
    check(LIB.offload_client_get_stats(handle, ctypes.byref(st)))
    return st


class MemoCtypesTest(harness.ServerTestCase):
    """The memos through the .so, every "no request" counted at the server's /metrics."""

    @classmethod
    def setUpClass(cls):
        cls.server = harness.Server("ctypes-memo")
        cls.servers = [cls.server]
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def requests(self, *methods):
        """offload_requests_total of `methods` (summed over services and codes)."""
        url = "http://%s/metrics" % self.server.flag_value("metrics_address")
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("offload_requests_total{") and any(
                    'method="%s"' % m in line for m in methods):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def client(self, flags, **fields):
        handle = ctypes.c_void_p()
        options = Options(endpoints=self.server.address.encode(), timeout_ms=30000, flags=flags,
                          **fields)
        check(LIB.offload_client_create_with_options(ctypes.byref(options), ctypes.byref(handle)))
        self.addCleanup(LIB.offload_client_destroy, handle)
        return handle

    def test_a_memo_needs_a_maximum_age(self):
        handle = ctypes.c_void_p()
        for flag, field in ((DERIVE_MEMO, b"derive_memo_max_age_ms"),
                            (OPEN_MEMO, b"open_memo_max_age_ms")):
            options = Options(endpoints=self.server.address.encode(), flags=flag)
            self.assertEqual(LIB.offload_client_create_with_options(ctypes.byref(options),
                                                                    ctypes.byref(handle)),
                             INVALID_ARGUMENT)
            self.assertIn(field, LIB.offload_last_error())
            self.assertIsNone(handle.value)

    def test_repeats_make_no_request_at_the_server(self):
        c = self.client(DERIVE_MEMO | OPEN_MEMO, derive_memo_max_age_ms=600000,
                        open_memo_max_age_ms=600000, open_memo_bytes=1 << 20)
        st = stats(c)
        self.assertEqual((st.verify_memo.capacity_bytes, st.derive_memo.capacity_bytes,
                          st.open_memo.capacity_bytes), (1 << 20, 1 << 20, 1 << 20))
        pk = (ctypes.c_uint8 * 32)()
        n = ctypes.c_size_t(32)
        check(LIB.offload_key_create(c, b"pm-x", X25519, pk, ctypes.byref(n)))
        check(LIB.offload_key_create(c, b"pm-aead", XCHACHA, None, None))
        peer = nacl.public.PrivateKey.generate()
        peer_pk = bytes(peer.public_key)
        want = nacl.bindings.crypto_scalarmult(bytes(peer), bytes(pk))

        before = self.requests("Derive", "BatchDerive")
        for _ in range(10):
            self.assertEqual(out_call(LIB.offload_derive, c, b"pm-x", peer_pk, 32, RAW), want)
        # out_call asks for the size first: that first call is the one request, and every other
        # call (the size queries included) is answered from the memo.
        self.assertEqual(self.requests("Derive", "BatchDerive") - before, 1)
        self.assertEqual(stats(c).derive_memo.hits, 19)

        blob = os.urandom(2000)
        env = out_call(LIB.offload_aead_seal, c, b"pm-aead", blob, len(blob), b"ad", 2)
        before = self.requests("Open", "BatchOpen")
        for _ in range(5):
            self.assertEqual(out_call(LIB.offload_aead_open, c, b"pm-aead", env, len(env),
                                      b"ad", 2), blob)
        self.assertEqual(self.requests("Open", "BatchOpen") - before, 0)
        # A wrong associated data and a tampered envelope: asked every time, never remembered.
        tampered = env[:-1] + bytes([env[-1] ^ 1])
        for wrong_env, ad in ((env, b"other"), (tampered, b"ad"), (env, b"other"),
                              (tampered, b"ad")):
            with self.assertRaises(OffloadError) as e:
                out_call(LIB.offload_aead_open, c, b"pm-aead", wrong_env, len(wrong_env), ad,
                         len(ad))
            self.assertEqual(e.exception.code, INVALID_ARGUMENT)
        self.assertEqual(self.requests("Open", "BatchOpen") - before, 4)
        # Two entries: out_call's size query sealed (and recorded) an envelope too.
        self.assertEqual(stats(c).open_memo.entries, 2)

        # Another client disables the key: this one still answers from memory until a refusal
        # about the key reaches it, which drops the key's entries at once.
        admin = self.client(0)
        check(LIB.offload_key_disable(admin, b"pm-x"))
        other = nacl.public.PrivateKey.generate()
        with self.assertRaises(OffloadError) as e:
            out_call(LIB.offload_derive, c, b"pm-x", bytes(other.public_key), 32, RAW)
        self.assertEqual(e.exception.code, FAILED_PRECONDITION)
        self.assertEqual(stats(c).derive_memo.entries, 0)
        before = self.requests("Derive", "BatchDerive")
        with self.assertRaises(OffloadError):
            out_call(LIB.offload_derive, c, b"pm-x", peer_pk, 32, RAW)
        self.assertEqual(self.requests("Derive", "BatchDerive") - before, 1)

        # Reset wipes every memo: the next open is a request again.
        check(LIB.offload_client_reset(c))
        self.assertEqual(stats(c).open_memo.entries, 0)
        before = self.requests("Open", "BatchOpen")
        self.assertEqual(out_call(LIB.offload_aead_open, c, b"pm-aead", env, len(env), b"ad", 2),
                         blob)
        self.assertEqual(self.requests("Open", "BatchOpen") - before, 1)

    def test_an_entry_past_its_age_is_not_used(self):
        c = self.client(OPEN_MEMO, open_memo_max_age_ms=400)
        check(LIB.offload_key_create(c, b"pa-aead", XCHACHA, None, None))
        env = out_call(LIB.offload_aead_seal, c, b"pa-aead", b"short-lived", 11, None, 0)
        time.sleep(0.6)
        before = self.requests("Open", "BatchOpen")
        self.assertEqual(out_call(LIB.offload_aead_open, c, b"pa-aead", env, len(env), None, 0),
                         b"short-lived")
        self.assertGreaterEqual(self.requests("Open", "BatchOpen") - before, 1)
        self.assertGreaterEqual(stats(c).open_memo.expired, 1)

    def test_verify_memo_off(self):
        c = self.client(NO_VERIFY_MEMO)
        self.assertEqual(stats(c).verify_memo.capacity_bytes, 0)
        signer = nacl.signing.SigningKey(bytes([3]) * 32)
        pk = bytes(signer.verify_key)
        sig = signer.sign(b"m").signature
        before = self.requests("Verify", "BatchVerify")
        v = ctypes.c_int(-1)
        for _ in range(3):
            check(LIB.offload_verify(c, pk, 32, b"m", 1, sig, 64, ctypes.byref(v)))
            self.assertEqual(v.value, 1)
        self.assertEqual(self.requests("Verify", "BatchVerify") - before, 3)
        on = self.client(0)
        before = self.requests("Verify", "BatchVerify")
        for _ in range(3):
            check(LIB.offload_verify(on, pk, 32, b"m", 1, sig, 64, ctypes.byref(v)))
        self.assertEqual(self.requests("Verify", "BatchVerify") - before, 1)

    def test_stats_struct_protocol(self):
        c = self.client(0)
        short = Stats()
        short.struct_size = 4
        self.assertEqual(LIB.offload_client_get_stats(c, ctypes.byref(short)), INVALID_ARGUMENT)
        # A caller that knows only the first fields gets those, and nothing written past them.
        class Head(ctypes.Structure):
            _fields_ = [("struct_size", ctypes.c_uint64), ("calls", ctypes.c_uint64),
                        ("rpcs", ctypes.c_uint64), ("guard", ctypes.c_uint64)]
        head = Head(struct_size=24, guard=0xfeed)
        check(LIB.offload_client_get_stats(c, ctypes.cast(ctypes.byref(head),
                                                          ctypes.POINTER(Stats))))
        self.assertEqual(head.struct_size, 24)
        self.assertEqual(head.guard, 0xfeed)


ISSUER, AUDIENCE = "https://id.ctypes-test.example", "crypto-offload"


@unittest.skipIf(jwt is None, "needs python3-jwt and python3-cryptography")
class TokenCtypesTest(harness.ServerTestCase):
    """A plain-text server that requires a token (localhost development); ops-admin may do all."""

    @classmethod
    def setUpClass(cls):
        cls.key = ed25519.Ed25519PrivateKey.generate()
        x = cls.key.public_key().public_bytes(serialization.Encoding.Raw,
                                              serialization.PublicFormat.Raw)
        cls.dir = tempfile.mkdtemp(prefix="ctypes-tokens-", dir=harness._WORK)
        jwks = os.path.join(cls.dir, "jwks.json")
        with open(jwks, "w") as f:
            json.dump({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1",
                                 "x": base64.urlsafe_b64encode(x).rstrip(b"=").decode()}]}, f)
        policy = os.path.join(cls.dir, "policy.json")
        with open(policy, "w") as f:
            json.dump({"admins": ["ops-admin"],
                       "grants": [{"client": "ops-admin", "keys": ["*"], "operations": ["*"]}]}, f)
        cls.server = harness.Server("ctypes-tokens", args=[
            "--jwks_file=" + jwks, "--token_issuer=" + ISSUER, "--token_audience=" + AUDIENCE,
            "--require_identity", "--policy_file=" + policy])
        cls.servers = [cls.server]
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def token(self, sub="ops-admin", lifetime=600, **claims):
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + lifetime}
        body.update(claims)
        return jwt.encode(body, self.key, algorithm="EdDSA", headers={"kid": "k1"}).encode()

    def client(self, **fields):
        handle = ctypes.c_void_p()
        options = Options(endpoints=self.server.address.encode(), timeout_ms=5000, **fields)
        check(LIB.offload_client_create_with_options(ctypes.byref(options), ctypes.byref(handle)))
        self.addCleanup(LIB.offload_client_destroy, handle)
        return handle

    def test_layout_matches_the_library(self):
        o = Options()
        ctypes.memset(ctypes.byref(o), 0xff, ctypes.sizeof(o))
        LIB.offload_client_options_init(ctypes.byref(o))
        self.assertEqual(o.struct_size, ctypes.sizeof(Options))
        self.assertIsNone(o.bearer_token)
        handle = ctypes.c_void_p()
        self.assertEqual(LIB.offload_client_create_with_options(
            ctypes.byref(Options(endpoints=b"127.0.0.1:1", flags=0x40)), ctypes.byref(handle)),
            INVALID_ARGUMENT)
        self.assertIn(b"flags", LIB.offload_last_error())
        short = Options(endpoints=b"127.0.0.1:1")
        short.struct_size = Options.bearer_token.offset  # without the first layout's last field
        self.assertEqual(LIB.offload_client_create_with_options(ctypes.byref(short),
                                                                ctypes.byref(handle)),
                         INVALID_ARGUMENT)
        self.assertIn(b"struct_size", LIB.offload_last_error())
        self.assertIsNone(handle.value)
        # The first layout (up to bearer_token) is still accepted, with the default memos; in it
        # the derive memo's flag is refused, since its maximum age lies beyond the struct.
        first = Options(endpoints=b"127.0.0.1:1", flags=DERIVE_MEMO, derive_memo_max_age_ms=9)
        first.struct_size = Options.bearer_token.offset + ctypes.sizeof(ctypes.c_void_p)
        self.assertEqual(LIB.offload_client_create_with_options(ctypes.byref(first),
                                                                ctypes.byref(handle)),
                         INVALID_ARGUMENT)
        self.assertIn(b"derive_memo_max_age_ms", LIB.offload_last_error())
        first.flags = 0
        check(LIB.offload_client_create_with_options(ctypes.byref(first), ctypes.byref(handle)))
        st = stats(handle)
        self.assertEqual((st.verify_memo.capacity_bytes, st.derive_memo.capacity_bytes),
                         (1 << 20, 0))
        LIB.offload_client_destroy(handle)

    def test_no_token_then_set_then_refreshed(self):
        c = self.client()
        self.assertEqual(LIB.offload_key_create(c, b"t-ed", ED25519, None, None), UNAUTHENTICATED)
        check(LIB.offload_client_set_token(c, self.token()))
        check(LIB.offload_key_create(c, b"t-ed", ED25519, None, None))
        expired = self.token(lifetime=-3600)
        check(LIB.offload_client_set_token(c, expired))
        self.assertEqual(LIB.offload_key_delete(c, b"t-ed"), UNAUTHENTICATED)
        self.assertNotIn(expired, LIB.offload_last_error())
        check(LIB.offload_client_set_token(c, self.token(jti="fresh")))
        check(LIB.offload_key_delete(c, b"t-ed"))
        check(LIB.offload_client_set_token(c, self.token(sub="nobody")))
        self.assertEqual(LIB.offload_key_create(c, b"t-ed", ED25519, None, None),
                         PERMISSION_DENIED)
        check(LIB.offload_client_set_token(c, None))
        self.assertEqual(LIB.offload_key_create(c, b"t-ed", ED25519, None, None), UNAUTHENTICATED)
        self.assertEqual(LIB.offload_client_set_token(c, b"bad token"), INVALID_ARGUMENT)
        self.assertNotIn(b"bad token", LIB.offload_last_error())

    def test_token_replaced_while_threads_call(self):
        """Tokens swapped under concurrent (auto-batched) verifies: every call carries a valid
        one, so every call is answered."""
        tokens = [self.token(jti=str(i)) for i in range(2)]
        c = self.client(bearer_token=tokens[0])
        signer = nacl.signing.SigningKey(bytes([9]) * 32)
        pk = bytes(signer.verify_key)
        cases = [(b"m%d" % i, signer.sign(b"m%d" % i).signature) for i in range(48)]
        results = [None] * len(cases)
        done = threading.Event()

        def swap():
            i = 0
            while not done.is_set():
                i += 1
                LIB.offload_client_set_token(c, tokens[i % 2])

        swapper = threading.Thread(target=swap)
        swapper.start()

        def run(i):
            v = ctypes.c_int(-1)
            m, s = cases[i]
            results[i] = (LIB.offload_verify(c, pk, 32, m, len(m), s, 64, ctypes.byref(v)), v.value)

        try:
            for t in harness.thread_run(run, len(cases)):
                t.join()
        finally:
            done.set()
            swapper.join()
        self.assertEqual(results, [(OK, 1)] * len(cases))


if __name__ == "__main__":
    unittest.main()
