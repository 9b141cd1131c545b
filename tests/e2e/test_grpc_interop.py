"""gRPC interop: the gRPC port of a real offload_server (served by our engine), driven by two
independent clients, Debian's python3-grpcio (here) and
the gRPC C++ library (Debian's libgrpc++ 1.51: interop_cpp/, the program OFFLOAD_INTEROP_CLIENT
names, run against the same server). Each case runs once per client (test_<case>_python,
test_<case>_cpp):

  unary        Ed25519 Sign (deterministic) / Verify, a BatchVerify, AEAD Seal / Open with
               associated data (other associated data: INVALID_ARGUMENT);
  errors       bad sizes are INVALID_ARGUMENT naming the field (public_key, signature,
               envelope), a missing key NOT_FOUND, an unknown method UNIMPLEMENTED; where
               grpc-status-details-bin comes, it decodes to the same code and message (the
               engine sends none today);
  deadline     a 1 ms deadline on a 1024-item batch of full verifications: DEADLINE_EXCEEDED;
  cancel       a unary call cancelled in flight, a health Watch cancelled after its first
               message: CANCELLED, and the connection goes on serving;
  gzip         a gzip'd request (Seal of 1 MiB of text) and a gzip'd answer (its Open): neither
               client lets its caller see the encoding, so both run through a byte-counting
               relay here, and each direction carries well under the 2 MiB it would without gzip;
  metadata     text, long text and -bin request metadata (a value with every byte) pass; the
               response metadata the client shows is the engine's date and server headers,
               none in the trailers;
  max_message  requests of exactly --max_message_bytes (16 MiB, the default: an Ed25519 Verify,
               an AEAD Open whose Seal came just under it) succeed, one byte more is
               RESOURCE_EXHAUSTED;
  reflection   grpc.reflection v1 (and v1alpha, Python) ServerReflectionInfo: the services
               listed, the file of offload.v1.AeadService into a descriptor pool, and a Seal made
               with message classes from that pool alone (Python: channel.unary_unary; C++:
               grpc::GenericStub), opened by the generated stubs.

And one drain for both clients: each holds a health Watch (SERVING); on SIGTERM both hear
NOT_SERVING and their streams end UNAVAILABLE, and the server exits 0.

    OFFLOAD_SERVER=build/bin/offload_server OFFLOAD_INTEROP_CLIENT=build/bin/offload_grpc_interop_client \
        /usr/bin/python3 -m unittest -v tests/e2e/test_grpc_interop.py
"""

import contextlib
import os
import queue
import random
import socket
import subprocess
import threading
import unittest

import grpc

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from harness import Server, ServerTestCase, pb, rpc_error
from test_grpc_engine import pool_of, reflection_stubs

T = 60
MAX = 16 * 1024 * 1024           # the server's default --max_message_bytes
GZIP_PLAINTEXT = 1024 * 1024     # interop_client.cc's kGzipPlaintextBytes
CHACHA_OVERHEAD = 1 + 4 + 12 + 16  # envelope: version, key version, nonce, tag
ED_KEY, AEAD_KEY = "interop-py-ed", "interop-py-aead"
SERVING = pb.health.HealthCheckResponse.SERVING
NOT_SERVING = pb.health.HealthCheckResponse.NOT_SERVING
SERVICES = {"offload.v1.KeyService", "offload.v1.Ed25519Service", "offload.v1.X25519Service",
            "offload.v1.BoxService", "offload.v1.AeadService", "grpc.health.v1.Health"}


def interop_client():
    path = os.environ.get("OFFLOAD_INTEROP_CLIENT")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("OFFLOAD_INTEROP_CLIENT=%r is not an executable (the path of "
                           "offload_grpc_interop_client; CMake passes it)" % path)
    return path


def compressible_text(n):
    line = b'{"user":42,"state":"a compressible line of text, as JSON state blobs are"}\n'
    return (line * (n // len(line) + 1))[:n]


def slow_batch(signed, seed):
    """1024 full verifications that fail: the valid signature `signed` (a SignResponse) under
    other messages. Failures are never memoised, so every call costs the server 1024 curve
    operations (tens of milliseconds)."""
    rnd = random.Random(seed)
    return pb.ed.BatchVerifyRequest(items=[
        pb.ed.VerifyRequest(public_key=signed.public_key, message=rnd.randbytes(1024),
                            signature=signed.signature) for _ in range(1024)])


def sized_to_max(request, field):
    """The bytes that make `request` exactly MAX once put in its bytes field `field` (any length
    from 2 MiB on takes a 4-byte varint, so one correction is exact)."""
    probe = type(request)()
    probe.CopyFrom(request)
    setattr(probe, field, bytes(MAX - 64))
    return os.urandom(MAX - 64 + MAX - probe.ByteSize())


def rpc_status_class():
    """google.rpc.Status (code, message; details left unknown), for grpc-status-details-bin."""
    f = descriptor_pb2.FileDescriptorProto(name="interop/rpc_status.proto", package="google.rpc",
                                           syntax="proto3")
    m = f.message_type.add(name="Status")
    m.field.add(name="code", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    m.field.add(name="message", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_class(pool, pool.FindMessageTypeByName("google.rpc.Status"))


def message_class(pool, descriptor):
    """The message class of `descriptor` (protobuf 4.21 has no message_factory.GetMessageClass)."""
    get = getattr(message_factory, "GetMessageClass", None)
    return get(descriptor) if get else message_factory.MessageFactory(pool).GetPrototype(descriptor)


class CountingProxy:
    """A loopback TCP relay to `target` ("host:port") that counts the bytes it carries each way:
    `up` from the client, `down` from the server."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets = [self._listener]
        self.up = 0
        self.down = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            for src, dst, way in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pump, args=(src, dst, way), daemon=True).start()

    def _pump(self, src, dst, way):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    setattr(self, way, getattr(self, way) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self):
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


class GrpcInteropTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server("interop")
        cls.servers = [cls.server]
        cls.server.start()
        cls.server.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id=ED_KEY, type=pb.keys.KEY_TYPE_ED25519), timeout=T)
        cls.server.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id=AEAD_KEY, type=pb.keys.KEY_TYPE_CHACHA20_POLY1305), timeout=T)
        cls.signed = cls.server.ed.Sign(pb.ed.SignRequest(key_id=ED_KEY, message=b"slow"),
                                        timeout=T)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    # -- helpers ---------------------------------------------------------------------------

    def run_cpp(self, case, address=None):
        """Runs the C++ client's `case` against the server (or `address`); asserts it passed."""
        run = subprocess.run([interop_client(), "--address=" + (address or self.server.address),
                              "--cases=" + case], capture_output=True, text=True, timeout=300)
        output = "%s%s" % (run.stdout, run.stderr)
        self.assertEqual(run.returncode, 0, "C++ client, case %s:\n%s" % (case, output))
        self.assertIn("PASS %s\n" % case, run.stdout, output)

    def assertServing(self, stubs=None):
        health = (stubs or self.server).health
        self.assertEqual(health.Check(pb.health.HealthCheckRequest(), timeout=T).status, SERVING)

    def assertStatus(self, code, fn, *args, contains=(), **kwargs):
        """assertRpcError, plus: grpc-status-details-bin, if sent, agrees with the status."""
        err = self.assertRpcError(code, fn, *args, contains=contains, timeout=T, **kwargs)
        for key, value in err.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                status = rpc_status_class().FromString(value)
                self.assertEqual((status.code, status.message), (code.value[0], err.details()))
        return err

    def assertGzipOnTheWire(self, proxy):
        # Without gzip each way carries about 2 MiB: the plaintext once in the clear (Seal's
        # request, Open's answer) and once as ciphertext (Seal's answer, Open's request).
        self.assertLess(proxy.up, 1.5 * GZIP_PLAINTEXT, "the Seal request was not compressed")
        self.assertLess(proxy.down, 1.5 * GZIP_PLAINTEXT, "the Open answer was not compressed")

    # -- unary -----------------------------------------------------------------------------

    def test_unary_python(self):
        s, msg = self.server, b"interop from Python"
        signed = s.ed.Sign(pb.ed.SignRequest(key_id=ED_KEY, message=msg), timeout=T)
        self.assertEqual((len(signed.signature), len(signed.public_key)), (64, 32))
        again = s.ed.Sign(pb.ed.SignRequest(key_id=ED_KEY, message=msg), timeout=T)
        self.assertEqual(again.signature, signed.signature)  # Ed25519 is deterministic
        verify = lambda m: s.ed.Verify(pb.ed.VerifyRequest(
            public_key=signed.public_key, message=m, signature=signed.signature), timeout=T).valid
        self.assertTrue(verify(msg))
        self.assertFalse(verify(msg + b"!"))
        batch = s.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=[
            pb.ed.VerifyRequest(public_key=signed.public_key, message=msg if i % 2 == 0 else b"x",
                                signature=signed.signature) for i in range(8)]), timeout=T)
        self.assertEqual([r.valid for r in batch.results], [i % 2 == 0 for i in range(8)])

        pt = os.urandom(3000)
        env = s.aead.Seal(pb.aead.AeadSealRequest(key_id=AEAD_KEY, plaintext=pt,
                                                  associated_data=b"user-42"), timeout=T).envelope
        self.assertEqual(len(env), len(pt) + CHACHA_OVERHEAD)
        opened = s.aead.Open(pb.aead.AeadOpenRequest(key_id=AEAD_KEY, envelope=env,
                                                     associated_data=b"user-42"), timeout=T)
        self.assertEqual(opened.plaintext, pt)
        self.assertStatus(grpc.StatusCode.INVALID_ARGUMENT, s.aead.Open, pb.aead.AeadOpenRequest(
            key_id=AEAD_KEY, envelope=env, associated_data=b"user-43"))

    def test_unary_cpp(self):
        self.run_cpp("unary")

    # -- errors ----------------------------------------------------------------------------

    def test_errors_python(self):
        s = self.server
        self.assertStatus(grpc.StatusCode.INVALID_ARGUMENT, s.ed.Verify, pb.ed.VerifyRequest(
            public_key=b"k" * 5, message=b"m", signature=b"s" * 64), contains="public_key")
        self.assertStatus(grpc.StatusCode.INVALID_ARGUMENT, s.ed.Verify, pb.ed.VerifyRequest(
            public_key=b"k" * 32, message=b"m", signature=b"s" * 10), contains="signature")
        self.assertStatus(grpc.StatusCode.INVALID_ARGUMENT, s.aead.Open, pb.aead.AeadOpenRequest(
            key_id=AEAD_KEY, envelope=b"short"), contains="envelope")
        self.assertStatus(grpc.StatusCode.NOT_FOUND, s.ed.Sign, pb.ed.SignRequest(
            key_id="interop-py-missing", message=b"m"), contains="interop-py-missing")
        self.assertStatus(grpc.StatusCode.UNIMPLEMENTED,
                          s.channel.unary_unary("/offload.v1.Ed25519Service/Nope"), b"",
                          contains="Nope")
        self.assertServing()

    def test_errors_cpp(self):
        self.run_cpp("errors")

    # -- deadline --------------------------------------------------------------------------

    def test_deadline_python(self):
        self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, self.server.ed.BatchVerify,
                            slow_batch(self.signed, 2), timeout=0.001)
        self.assertServing()

    def test_deadline_cpp(self):
        self.run_cpp("deadline")

    # -- cancellation ----------------------------------------------------------------------

    def test_cancel_python(self):
        s = self.server
        # The batch takes the server tens of milliseconds and the cancel follows its start at
        # once; should the call win the race all the same, a fresh batch tries again.
        for attempt in range(5):
            call = s.ed.BatchVerify.future(slow_batch(self.signed, 100 + attempt), timeout=T)
            if call.cancel():
                break
        self.assertTrue(call.cancelled(), "the call finished before every cancel")
        self.assertEqual(call.code(), grpc.StatusCode.CANCELLED)

        watch = s.health.Watch(pb.health.HealthCheckRequest(), timeout=T)
        self.assertEqual(next(watch).status, SERVING)
        watch.cancel()
        err = rpc_error(next, watch)
        self.assertIsNotNone(err, "the Watch went on after its cancel")
        self.assertEqual(err.code(), grpc.StatusCode.CANCELLED)
        self.assertServing()

    def test_cancel_cpp(self):
        self.run_cpp("cancel")

    # -- gzip ------------------------------------------------------------------------------

    def test_gzip_python(self):
        proxy = CountingProxy(self.server.address)
        self.addCleanup(proxy.close)
        channel = grpc.insecure_channel(proxy.address, compression=grpc.Compression.Gzip, options=[
            ("grpc.max_send_message_length", 4 * GZIP_PLAINTEXT),
            ("grpc.max_receive_message_length", 4 * GZIP_PLAINTEXT),
            ("grpc.enable_http_proxy", 0)])
        self.addCleanup(channel.close)
        stubs = self.server.stubs_on(channel)
        pt = compressible_text(GZIP_PLAINTEXT)
        env = stubs.aead.Seal(pb.aead.AeadSealRequest(key_id=AEAD_KEY, plaintext=pt),
                              timeout=T).envelope
        self.assertEqual(stubs.aead.Open(pb.aead.AeadOpenRequest(key_id=AEAD_KEY, envelope=env),
                                         timeout=T).plaintext, pt)
        self.assertGzipOnTheWire(proxy)

    def test_gzip_cpp(self):
        proxy = CountingProxy(self.server.address)
        self.addCleanup(proxy.close)
        self.run_cpp("gzip", address=proxy.address)
        self.assertGzipOnTheWire(proxy)

    # -- metadata --------------------------------------------------------------------------

    def test_metadata_python(self):
        metadata = (("x-offload-key", ED_KEY), ("x-interop-text", "hello, interop"),
                    ("x-interop-long", "v" * 2048), ("x-interop-bin", bytes(range(256))))
        response, call = self.server.ed.Sign.with_call(
            pb.ed.SignRequest(key_id=ED_KEY, message=b"metadata"), metadata=metadata, timeout=T)
        self.assertEqual(len(response.signature), 64)
        # The response metadata an application sees is what the engine sends: date and server.
        initial = dict(call.initial_metadata())
        self.assertEqual(sorted(initial), ["date", "server"])
        self.assertEqual(initial["server"], "crypto-offload")
        self.assertEqual(tuple(call.trailing_metadata()), ())

    def test_metadata_cpp(self):
        self.run_cpp("metadata")

    # -- the largest messages --------------------------------------------------------------

    def test_max_message_python(self):
        s = self.server
        verify = pb.ed.VerifyRequest(public_key=bytes(32), signature=bytes(64))
        verify.message = sized_to_max(verify, "message")
        signed = s.ed.Sign(pb.ed.SignRequest(key_id=ED_KEY, message=verify.message), timeout=T)
        verify.public_key, verify.signature = signed.public_key, signed.signature
        self.assertEqual(verify.ByteSize(), MAX)
        self.assertTrue(s.ed.Verify(verify, timeout=T).valid)

        # The Open request carries the envelope, 33 bytes more than the plaintext: sized to the
        # limit, the Seal request and both answers fit.
        open_request = pb.aead.AeadOpenRequest(key_id=AEAD_KEY)
        pt = sized_to_max(open_request, "envelope")[CHACHA_OVERHEAD:]
        open_request.envelope = s.aead.Seal(pb.aead.AeadSealRequest(key_id=AEAD_KEY, plaintext=pt),
                                            timeout=T).envelope
        self.assertEqual(open_request.ByteSize(), MAX)
        self.assertEqual(s.aead.Open(open_request, timeout=T).plaintext, pt)

        over = pb.ed.SignRequest(key_id=ED_KEY)
        over.message = sized_to_max(over, "message") + b"x"
        self.assertEqual(over.ByteSize(), MAX + 1)
        self.assertStatus(grpc.StatusCode.RESOURCE_EXHAUSTED, s.ed.Sign, over)
        self.assertServing()

    def test_max_message_cpp(self):
        self.run_cpp("max_message")

    # -- reflection ------------------------------------------------------------------------

    def reflect(self, version, requests):
        msgs, stubs = reflection_stubs()[version]
        stub = stubs.ServerReflectionStub(self.server.channel)
        return list(stub.ServerReflectionInfo(
            iter([msgs.ServerReflectionRequest(**r) for r in requests]), timeout=T))

    def test_reflection_python(self):
        for version in ("v1", "v1alpha"):
            with self.subTest(version=version):
                listed, described = self.reflect(version, [
                    {"list_services": ""}, {"file_containing_symbol": "offload.v1.AeadService"}])
                names = {x.name for x in listed.list_services_response.service}
                self.assertLessEqual(SERVICES | {"grpc.reflection.%s.ServerReflection" % version},
                                     names)
                files = {}
                for raw in described.file_descriptor_response.file_descriptor_proto:
                    fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                    files[fd.name] = fd
                pool = pool_of(files)
                seal = pool.FindServiceByName("offload.v1.AeadService").methods_by_name["Seal"]
                Request = message_class(pool, seal.input_type)
                Response = message_class(pool, seal.output_type)
                call = self.server.channel.unary_unary(
                    "/offload.v1.AeadService/Seal", request_serializer=Request.SerializeToString,
                    response_deserializer=Response.FromString)
                pt = b"sealed by a reflected method (%s)" % version.encode()
                env = call(Request(key_id=AEAD_KEY, plaintext=pt), timeout=T).envelope
                self.assertEqual(self.server.aead.Open(pb.aead.AeadOpenRequest(
                    key_id=AEAD_KEY, envelope=env), timeout=T).plaintext, pt)

    def test_reflection_cpp(self):
        self.run_cpp("reflection")


class WatchAcrossDrainTest(ServerTestCase):
    """Both clients watch health on one server; SIGTERM: both hear NOT_SERVING, their streams
    end UNAVAILABLE, and the server exits 0."""

    def test_watch_across_drain(self):
        server = Server("interop-drain", args=["--drain_timeout=120s"])
        self.servers = [server]
        self.addCleanup(server.kill)
        server.start()

        cpp = subprocess.Popen([interop_client(), "--address=" + server.address,
                                "--cases=watch_drain"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: cpp.poll() is None and cpp.kill())
        cpp_lines = queue.Queue()  # its output, line by line, then None

        def read_cpp():
            with cpp.stdout:
                for line in cpp.stdout:
                    cpp_lines.put(line)
            cpp_lines.put(None)

        threading.Thread(target=read_cpp, daemon=True).start()

        channel = server.new_channel()
        self.addCleanup(channel.close)
        seen, ended, first = [], [], threading.Event()

        def watch():
            try:
                for r in pb.health_grpc.HealthStub(channel).Watch(
                        pb.health.HealthCheckRequest(), timeout=120):
                    seen.append(r.status)
                    first.set()
                ended.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                ended.append(e.code())
            first.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        self.assertEqual(cpp_lines.get(timeout=T), "WATCHING\n")
        self.assertTrue(first.wait(T))
        self.assertEqual(seen, [SERVING])

        rc, _ = server.terminate(timeout=150)
        watcher.join(T)
        cpp_rest = "".join(iter(lambda: cpp_lines.get(timeout=T), None))
        self.assertEqual(cpp.wait(T), 0, "C++ client: %s" % cpp_rest)
        self.assertEqual(cpp_rest, "PASS watch_drain\n")
        self.assertEqual(rc, 0, "the server did not exit cleanly after SIGTERM")
        self.assertEqual(seen, [SERVING, NOT_SERVING], "Python's Watch")
        self.assertEqual(ended, [grpc.StatusCode.UNAVAILABLE], "Python's Watch")


if __name__ == "__main__":
    unittest.main()
