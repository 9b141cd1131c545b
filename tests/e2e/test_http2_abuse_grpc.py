"""The HTTP/2 abuse cases of test_http2_abuse.py against the gRPC port served by our engine
(which serves it as it serves the HTTP port).

What changes from the HTTP port (the hooks of Http2Abuse):
  - the attacker's requests are gRPC: content-type application/grpc, `te: trailers`, each message
    length-prefixed (flag byte, 4-byte big-endian length);
  - the legitimate caller is Debian's python3-grpcio on its own channel from 127.0.0.1, making
    real Ed25519Service/Verify calls whose answers are checked;
  - the metrics and log lines are those of port="grpc";
  - a connection to the gRPC port may hold max(--http_connection_budget_bytes,
    4 x --max_message_bytes) of request bytes (service/main/server.cc, where the "grpc" gateway's
    options are built), and --http_connection_answer_budget_bytes of unsent answers as on the
    HTTP port; the memory budget of all its connections is --http_memory_budget_bytes, its own;
  - a budget refusal is gRPC's RESOURCE_EXHAUSTED (Trailers-Only, grpc-status 8) with
    grpc-status-details-bin.

    OFFLOAD_SERVER=build/service/main/offload_server /usr/bin/python3 -m unittest -v \\
        tests/e2e/test_http2_abuse_grpc.py
"""

import struct
import unittest

import grpc

# Imported as a module, not `from ... import Http2Abuse`: unittest would find the HTTP port's
# TestCase among this module's names and run it here too.
import test_http2_abuse as base
from harness import pb

# With --http_connection_budget_bytes at base.CONNECTION_BUDGET (1 MiB), 4 x this (2 MiB) is
# what decides the gRPC port's connection budget, as it does with the defaults (4 x 16 MiB).
MAX_MESSAGE = 512 << 10


class GrpcAttacker(base.Attacker):
    """A raw HTTP/2 connection whose requests are gRPC."""

    def header_block(self, path, content_type="application/grpc", extra=()):
        return super().header_block(path, content_type, [("te", "trailers")] + list(extra))

    def message(self, body):
        return b"\x00" + struct.pack(">I", len(body)) + body


class GrpcLegit(base.Legit):
    """Ed25519Service/Verify over gRPC (python3-grpcio) from 127.0.0.1 until stopped, on a
    channel (and connection) of its own; every answer is checked."""

    def run(self):
        channel = grpc.insecure_channel("127.0.0.1:%d" % self.port, options=[
            ("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0),
            ("grpc.use_local_subchannel_pool", 1)])  # not the harness channel's connection
        verify = channel.unary_unary(base.VERIFY,  # self.body is the serialized request
                                     response_deserializer=pb.ed.VerifyResponse.FromString)
        try:
            while not self.stop.is_set() or self.ok == 0:
                try:
                    answer = verify(self.body, timeout=30)
                    if answer.valid:
                        self.ok += 1
                    else:
                        self.failures.append("valid=false for a valid signature")
                except grpc.RpcError as e:
                    self.failures.append("%s: %s" % (e.code(), e.details()))
                if len(self.failures) > 20:
                    return
        finally:
            channel.close()


class Http2AbuseGrpcPort(base.Http2Abuse):
    PORT_KIND = "grpc"

    @classmethod
    def server_args(cls):
        return super().server_args() + ["--max_message_bytes=%d" % MAX_MESSAGE]

    def connection_budget(self):
        # service/main/server.cc: grpc_options.http.connection_budget_bytes.
        return max(self.flag("http_connection_budget_bytes"), 4 * self.flag("max_message_bytes"))

    def attacker(self):
        return GrpcAttacker(self.port())

    def refused_over_budget(self, fields):
        return fields.get("grpc-status") == "8" and "grpc-status-details-bin" in fields

    def legit(self):
        return GrpcLegit(self.port(), self.legit_body)


if __name__ == "__main__":
    unittest.main()
