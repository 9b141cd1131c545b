"""Native gRPC on the front-door engine (issue 24, first step): the HTTP port answers gRPC itself
(application/grpc over HTTP/2), driven by Debian's python3-grpcio as any gRPC client would.

  - every kind of call (single, batch, 55 KB AEAD) gives the same answers as the gRPC port;
  - errors carry the same codes and messages (Trailers-Only), an unknown method UNIMPLEMENTED,
    a message over --max_message_bytes RESOURCE_EXHAUSTED;
  - gzip both ways (grpc-encoding), counted in the metrics; custom and -bin metadata pass;
  - grpc.health.v1: Check on the whole server and on each service, NOT_FOUND for others; Watch
    streams SERVING, outlives the read and idle timeouts, and hears NOT_SERVING when a drain
    starts, then ends (UNAVAILABLE) without holding the exit;
  - server reflection, v1 and v1alpha (the bidirectional stream grpcurl, grpcui, Postman and
    `buf curl` use): every service it lists is described by the files it sends, with their
    imports, and a call built from those descriptors alone (as grpcurl builds it) is answered;
  - gRPC over HTTP/1.1 is refused as the spec's servers do (505).

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v tests/e2e/test_grpc_engine.py
"""

import importlib
import os
import re
import shutil
import subprocess
import threading
import time
import unittest
import urllib.request

import grpc

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from harness import MAX_MESSAGE, PROTO_DIR, Server, ServerTestCase, _WORK, pb

T = 30
MAX = 256 * 1024  # --max_message_bytes of these servers


def metric(port, name, **labels):
    """The value of one sample on the server's /metrics (0 if absent)."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{([^}]*)\})? (\S+)$", line)
        if m and m.group(1) == name:
            got = ",".join(sorted(p for p in (m.group(2) or "").split(",") if p))
            if got == want:
                return float(m.group(3))
    return 0.0


class GrpcOnEngineTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.servers = []
        cls.server = Server("grpc-engine", args=[
            "--max_message_bytes=%d" % MAX,
            "--http_read_timeout=1s", "--http_idle_timeout=1s", "--drain_timeout=120s"]).start()
        cls.servers = [cls.server]
        cls.http_port = cls.server.bound_port("http_address")
        cls.metrics_port = int(cls.server.flag_value("metrics_address").rsplit(":", 1)[1])
        s = cls.server
        s.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="ge-ed", type=pb.keys.KEY_TYPE_ED25519),
                         timeout=T)
        s.keys.CreateKey(pb.keys.CreateKeyRequest(
            key_id="ge-aead", type=pb.keys.KEY_TYPE_CHACHA20_POLY1305), timeout=T)
        cls.channel = cls.engine_channel()
        cls.stubs = s.stubs_on(cls.channel)

    @classmethod
    def engine_channel(cls, **kwargs):
        return grpc.insecure_channel("127.0.0.1:%d" % cls.http_port, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.enable_http_proxy", 0)], **kwargs)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        if cls.server.proc is not None:
            cls.server.stop()

    def test_answers_equal_the_grpc_port(self):
        s, e = self.server, self.stubs
        msg = b"engine says hello"
        sig = e.ed.Sign(pb.ed.SignRequest(key_id="ge-ed", message=msg), timeout=T).signature
        self.assertEqual(sig, s.ed.Sign(pb.ed.SignRequest(key_id="ge-ed", message=msg),
                                        timeout=T).signature)  # Ed25519 is deterministic
        pk = s.keys.GetKey(pb.keys.GetKeyRequest(key_id="ge-ed"), timeout=T).versions[0].public_key
        for stub in (e, s):
            self.assertTrue(stub.ed.Verify(pb.ed.VerifyRequest(
                public_key=pk, message=msg, signature=sig), timeout=T).valid)
            self.assertFalse(stub.ed.Verify(pb.ed.VerifyRequest(
                public_key=pk, message=msg + b"!", signature=sig), timeout=T).valid)
        items = [pb.ed.VerifyRequest(public_key=pk, message=msg if i % 2 else b"x", signature=sig)
                 for i in range(64)]
        r = e.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=items), timeout=T)
        self.assertEqual([x.valid for x in r.results], [bool(i % 2) for i in range(64)])
        # 55 KB through AEAD: sealed on one port, opened on the other, both ways.
        pt = os.urandom(55 * 1024)
        env = e.aead.Seal(pb.aead.AeadSealRequest(key_id="ge-aead", plaintext=pt), timeout=T).envelope
        self.assertEqual(s.aead.Open(pb.aead.AeadOpenRequest(key_id="ge-aead", envelope=env),
                                     timeout=T).plaintext, pt)
        env2 = s.aead.Seal(pb.aead.AeadSealRequest(key_id="ge-aead", plaintext=pt), timeout=T).envelope
        for _ in range(2):  # the second is a memo hit, answered on the loop
            self.assertEqual(e.aead.Open(pb.aead.AeadOpenRequest(key_id="ge-aead", envelope=env2),
                                         timeout=T).plaintext, pt)

    def test_errors_keep_their_codes(self):
        e = self.stubs
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, e.ed.Sign,
                            pb.ed.SignRequest(key_id="ge-missing", message=b"m"), timeout=T,
                            contains=["ge-missing"])
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, e.ed.Verify,
                            pb.ed.VerifyRequest(public_key=b"short", message=b"m",
                                                signature=bytes(64)), timeout=T,
                            contains=["public_key"])
        unknown = self.channel.unary_unary("/offload.v1.Ed25519Service/Nope")
        self.assertRpcError(grpc.StatusCode.UNIMPLEMENTED, unknown, b"", timeout=T,
                            contains=["Nope"])
        big = pb.aead.AeadSealRequest(key_id="ge-aead", plaintext=bytes(MAX + 1))
        self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, e.aead.Seal, big, timeout=T)
        # The connection is still good after each of them.
        self.assertEqual(e.health.Check(pb.health.HealthCheckRequest(), timeout=T).status,
                         pb.health.HealthCheckResponse.SERVING)

    def test_metadata_passes(self):
        msg = b"metadata"
        sig = self.stubs.ed.Sign(pb.ed.SignRequest(key_id="ge-ed", message=msg), timeout=T,
                                 metadata=(("x-offload-key", "ge-ed"), ("x-trace", "abc"),
                                           ("x-trace-bin", b"\x00\x01\xff"))).signature
        self.assertEqual(len(sig), 64)

    def test_gzip_both_ways(self):
        before_in = metric(self.metrics_port, "offload_http_received_bytes_total", encoding="gzip")
        before_out = metric(self.metrics_port, "offload_http_sent_bytes_total", encoding="gzip")
        ch = self.engine_channel(compression=grpc.Compression.Gzip)
        try:
            stubs = self.server.stubs_on(ch)
            pt = (b"a compressible line of text, as JSON state blobs are\n" * 1200)[:60000]
            env = stubs.aead.Seal(pb.aead.AeadSealRequest(key_id="ge-aead", plaintext=pt),
                                  timeout=T).envelope
            self.assertEqual(stubs.aead.Open(pb.aead.AeadOpenRequest(key_id="ge-aead", envelope=env),
                                             timeout=T).plaintext, pt)
        finally:
            ch.close()
        after_in = metric(self.metrics_port, "offload_http_received_bytes_total", encoding="gzip")
        after_out = metric(self.metrics_port, "offload_http_sent_bytes_total", encoding="gzip")
        self.assertGreater(after_in, before_in, "no gzip request body arrived")
        self.assertGreater(after_out, before_out, "no response was gzipped")
        # Compressed, the 60 KB plaintext took far less than its size each way.
        self.assertLess(after_out - before_out, 20000)

    def test_health_check(self):
        h = self.stubs.health
        for service in ("", "offload.v1.Ed25519Service", "offload.v1.KeyService"):
            self.assertEqual(h.Check(pb.health.HealthCheckRequest(service=service), timeout=T).status,
                             pb.health.HealthCheckResponse.SERVING, service)
        self.assertRpcError(grpc.StatusCode.NOT_FOUND, h.Check,
                            pb.health.HealthCheckRequest(service="no.such.Service"), timeout=T)

    @unittest.skipUnless(shutil.which("curl"), "needs curl")
    def test_grpc_over_http1_is_refused(self):
        out = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--http1.1", "--max-time", "10",
             "-H", "content-type: application/grpc", "--data-binary", "@-",
             "http://127.0.0.1:%d/offload.v1.Ed25519Service/Verify" % self.http_port],
            input=b"\x00\x00\x00\x00\x00", capture_output=True, check=True).stdout
        self.assertEqual(out, b"505")


def pool_of(files):
    """A fresh descriptor pool of `files` (name -> FileDescriptorProto, as reflection sent them),
    each added after its imports, whatever order they came in. AssertionError when an import is
    missing."""
    pool = descriptor_pool.DescriptorPool()
    added = set()

    def add(name):
        if name in added:
            return
        if name not in files:
            raise AssertionError("an imported file never came: %s" % name)
        for dep in files[name].dependency:
            add(dep)
        pool.Add(files[name])
        added.add(name)

    for name in files:
        add(name)
    return pool


def reflection_stubs():
    """Python stubs of grpc.reflection v1 (proto/grpc/reflection/v1) and v1alpha (the same file
    under the v1alpha package, as gRPC 1.51 and older tools name it)."""
    out = os.path.join(_WORK, "reflection-stubs")
    if not os.path.isdir(out):
        os.makedirs(out)
        src = os.path.join(PROTO_DIR, "grpc", "reflection", "v1", "reflection.proto")
        with open(src) as f:
            text = f.read()
        with open(os.path.join(out, "reflection_v1.proto"), "w") as f:
            f.write(text)
        with open(os.path.join(out, "reflection_v1alpha.proto"), "w") as f:
            f.write(text.replace("package grpc.reflection.v1;", "package grpc.reflection.v1alpha;"))
        subprocess.run(["protoc", "-I", out, "--python_out=" + out, "--grpc_out=" + out,
                        "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                        "reflection_v1.proto", "reflection_v1alpha.proto"], check=True)
    import sys
    if out not in sys.path:
        sys.path.insert(0, out)
    return {v: (importlib.import_module("reflection_%s_pb2" % v),
                importlib.import_module("reflection_%s_pb2_grpc" % v)) for v in ("v1", "v1alpha")}


class ReflectionTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        cls.server = Server("grpc-reflection")
        cls.servers = [cls.server]
        cls.server.start()
        cls.http_port = cls.server.bound_port("http_address")
        cls.channel = grpc.insecure_channel("127.0.0.1:%d" % cls.http_port,
                                            options=[("grpc.enable_http_proxy", 0)])
        cls.stubs = reflection_stubs()

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.stop()

    def ask(self, version, requests):
        """The answers to `requests` (dicts of ServerReflectionRequest fields), on one stream."""
        msgs, grpc_mod = self.stubs[version]
        stub = grpc_mod.ServerReflectionStub(self.channel)
        return list(stub.ServerReflectionInfo(
            iter([msgs.ServerReflectionRequest(**r) for r in requests]), timeout=T))

    EXPECTED = {"offload.v1.KeyService", "offload.v1.Ed25519Service", "offload.v1.X25519Service",
                "offload.v1.BoxService", "offload.v1.AeadService", "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}

    def describe(self, version, names):
        """A fresh descriptor pool holding what reflection sent for `names` (one stream), and the
        names of the files sent."""
        answers = self.ask(version, [{"file_containing_symbol": n} for n in names])
        protos = {}
        for name, a in zip(names, answers):
            self.assertEqual(a.WhichOneof("message_response"), "file_descriptor_response",
                             "%s: %s" % (name, a))
            self.assertEqual(a.original_request.file_containing_symbol, name)
            for raw in a.file_descriptor_response.file_descriptor_proto:
                fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
                protos[fd.name] = fd
        return pool_of(protos), set(protos)

    def test_lists_and_describes_every_service(self):
        for version in ("v1", "v1alpha"):
            [a] = self.ask(version, [{"list_services": ""}])
            listed = {s.name for s in a.list_services_response.service}
            self.assertEqual(listed, self.EXPECTED, version)
            pool, sent = self.describe(version, sorted(listed))
            for name in listed:
                service = pool.FindServiceByName(name)
                self.assertGreater(len(service.methods), 0, name)
                for m in service.methods:  # every type a method names came in a file sent
                    for t in (m.input_type, m.output_type):
                        self.assertIn(pool.FindMessageTypeByName(t.full_name).file.name, sent,
                                      "%s.%s" % (name, m.name))

    def test_a_call_from_reflected_descriptors(self):
        # As grpcurl does: no stubs, only what reflection said.
        s = self.server
        s.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="refl-ed", type=pb.keys.KEY_TYPE_ED25519),
                         timeout=T)
        pool, _ = self.describe("v1", ["offload.v1.Ed25519Service.Sign"])
        method = pool.FindServiceByName("offload.v1.Ed25519Service").methods_by_name["Sign"]
        factory = message_factory.MessageFactory(pool)
        Request = factory.GetPrototype(method.input_type)
        Response = factory.GetPrototype(method.output_type)
        call = self.channel.unary_unary("/offload.v1.Ed25519Service/Sign",
                                        request_serializer=Request.SerializeToString,
                                        response_deserializer=Response.FromString)
        r = call(Request(key_id="refl-ed", message=b"reflected"), timeout=T)
        self.assertEqual(len(r.signature), 64)

    def test_files_once_per_stream_and_errors(self):
        a = self.ask("v1", [{"file_by_filename": "offload/v1/ed25519.proto"},
                            {"file_by_filename": "offload/v1/ed25519.proto"},
                            {"file_containing_symbol": "no.such.Symbol"},
                            {"file_by_filename": "no/such.proto"},
                            {"all_extension_numbers_of_type": "offload.v1.SignRequest"}])
        first = [descriptor_pb2.FileDescriptorProto.FromString(x).name
                 for x in a[0].file_descriptor_response.file_descriptor_proto]
        again = [descriptor_pb2.FileDescriptorProto.FromString(x).name
                 for x in a[1].file_descriptor_response.file_descriptor_proto]
        self.assertEqual(first[0], "offload/v1/ed25519.proto")
        self.assertIn("offload/v1/common.proto", first)
        self.assertEqual(again, ["offload/v1/ed25519.proto"])  # its imports were sent already
        for i in (2, 3):
            self.assertEqual(a[i].error_response.error_code, grpc.StatusCode.NOT_FOUND.value[0], a[i])
        self.assertEqual(a[4].all_extension_numbers_response.base_type_name, "offload.v1.SignRequest")


class HealthWatchDrainTest(ServerTestCase):
    """Open streams (health Watch, a reflection session) outlive the read and idle timeouts, and
    a drain tells and ends them instead of waiting for them."""

    def test_watch_hears_the_drain(self):
        server = Server("grpc-engine-watch", args=[
            "--http_read_timeout=1s", "--http_idle_timeout=1s", "--drain_timeout=120s"]).start()
        http_port = server.bound_port("http_address")
        self.servers = [server]
        self.addCleanup(server.kill)
        ch = grpc.insecure_channel("127.0.0.1:%d" % http_port, options=[("grpc.enable_http_proxy", 0)])
        self.addCleanup(ch.close)
        stub = pb.health_grpc.HealthStub(ch)
        seen, ended = [], []

        def watch(service):
            try:
                for r in stub.Watch(pb.health.HealthCheckRequest(service=service), timeout=60):
                    seen.append((service, r.status))
                ended.append((service, grpc.StatusCode.OK))
            except grpc.RpcError as e:
                ended.append((service, e.code()))

        # And a reflection stream left open, as a tool's session is: the drain ends it too.
        msgs, refl_grpc = reflection_stubs()["v1"]
        release = threading.Event()

        def requests():
            yield msgs.ServerReflectionRequest(list_services="")
            release.wait(60)

        def reflect():
            try:
                for r in refl_grpc.ServerReflectionStub(ch).ServerReflectionInfo(requests(), timeout=60):
                    seen.append(("reflection", len(r.list_services_response.service)))
                ended.append(("reflection", grpc.StatusCode.OK))
            except grpc.RpcError as e:
                ended.append(("reflection", e.code()))

        threads = [threading.Thread(target=watch, args=(s,), daemon=True)
                   for s in ("", "no.such.Service")] + [threading.Thread(target=reflect, daemon=True)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + T
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(sorted(seen), [("", pb.health.HealthCheckResponse.SERVING),
                                        ("no.such.Service", pb.health.HealthCheckResponse.SERVICE_UNKNOWN),
                                        ("reflection", 8)])
        # Watches a client cancels (the usual way a Watch ends) are let go: they must not hold
        # the drain below.
        for _ in range(3):
            cancelled = stub.Watch(pb.health.HealthCheckRequest(service=""), timeout=60)
            self.assertEqual(next(cancelled).status, pb.health.HealthCheckResponse.SERVING)
            cancelled.cancel()
        # Longer than the read and idle timeouts: a watch is a request under way, never cut.
        time.sleep(2.5)
        self.assertEqual(ended, [], "a Watch stream ended before the drain")
        rc, took = server.terminate(timeout=150)
        release.set()
        for t in threads:
            t.join(T)
        self.assertEqual(rc, 0)
        self.assertLess(took, 60, "the Watch streams held the drain")
        self.assertIn(("", pb.health.HealthCheckResponse.NOT_SERVING), seen)
        self.assertEqual(sorted(ended), [("", grpc.StatusCode.UNAVAILABLE),
                                         ("no.such.Service", grpc.StatusCode.UNAVAILABLE),
                                         ("reflection", grpc.StatusCode.UNAVAILABLE)])


if __name__ == "__main__":
    unittest.main()
