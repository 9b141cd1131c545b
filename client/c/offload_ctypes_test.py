"""FFI test: liboffload_c.so from Python through ctypes, against a live offload_server.

Environment (set by CMake): OFFLOAD_C_LIB (the .so), OFFLOAD_SERVER (the binary),
OFFLOAD_E2E_DIR (tests/e2e, whose harness starts servers on free loopback ports).
Results are cross-checked with PyNaCl (libsodium), an implementation independent of the service.
Run with /usr/bin/python3 (Debian's python3-grpcio and python3-nacl).
"""

import ctypes
import os
import sys
import threading
import unittest

sys.path.insert(0, os.environ.get("OFFLOAD_E2E_DIR", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "e2e")))
import harness  # noqa: E402

import nacl.bindings  # noqa: E402
import nacl.public  # noqa: E402
import nacl.signing  # noqa: E402

OK, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, BUFFER_TOO_SMALL = 0, 3, 5, 6, 100
ED25519, X25519, XCHACHA = 1, 2, 4
RAW, BOX = 1, 2

u8p = ctypes.POINTER(ctypes.c_uint8)
szp = ctypes.POINTER(ctypes.c_size_t)


def load():
    lib = ctypes.CDLL(os.environ["OFFLOAD_C_LIB"])
    sigs = {
        "offload_last_error": (ctypes.c_char_p, []),
        "offload_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "offload_client_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint32,
                                                  ctypes.POINTER(ctypes.c_void_p)]),
        "offload_client_destroy": (None, [ctypes.c_void_p]),
        "offload_key_create": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                              u8p, szp]),
        "offload_key_import": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int,
                                              ctypes.c_char_p, ctypes.c_size_t, u8p, szp]),
        "offload_key_delete": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
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
        check(LIB.offload_key_delete(self.c, b"py-aead"))
        n = ctypes.c_size_t(64)
        buf = (ctypes.c_uint8 * 64)()
        self.assertEqual(LIB.offload_aead_open(self.c, b"py-aead", env, len(env), b"ad", 2, buf,
                                               ctypes.byref(n)), NOT_FOUND)
        self.assertEqual(LIB.offload_key_delete(self.c, b"py-aead"), NOT_FOUND)


if __name__ == "__main__":
    unittest.main()
