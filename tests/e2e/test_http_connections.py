"""The HTTP port under many connections: no thread is tied to a connection.

2,000 idle keep-alive connections (each has made one call) and 500 connections that stopped in
the middle of their request headers are held open; a new Connect call (new connection) and a new
gRPC call (new channel) must still be answered at once, correctly. Then: a SIGTERM with all of
them open exits 0 promptly.

The server's read and idle timeouts are set far beyond the test (600 s), so nothing cuts the
held connections while it runs: a server that ties a thread to a connection could then answer a
new call only after one of them ends, and every new call here has a 10 s client timeout. The
test asserts answers, not speed; the measured times are printed. The drain timeout is long too
(120 s): a server that waited for the idle connections on SIGTERM would need all of it, one that
closes them exits at once.
"""

import http.client
import os
import resource
import signal
import socket
import time
import unittest
import urllib.request

import grpc

from harness import Server, ServerTestCase, pb

IDLE = 2000
STALLED = 500


def raise_fd_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def read_response(sock):
    """One HTTP/1.1 response (Content-Length framed) from a blocking socket: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError("connection closed before a response")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split(b" ")[1]), body


class HttpConnections(ServerTestCase):
    def test_idle_and_stalled_connections_do_not_delay_new_calls(self):
        limit = raise_fd_limit(IDLE + STALLED + 500)
        if limit < IDLE + STALLED + 200:
            self.skipTest("the open-file limit (%d) is below %d" % (limit, IDLE + STALLED + 200))
        server = Server("http-conns", backend="libsodium",
                        args=["--http_read_timeout=600s", "--http_idle_timeout=600s",
                              "--drain_timeout=120s"]).start()
        http_port = server.bound_port("http_address")
        self.addCleanup(server.kill)
        server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="signer",
                                                       type=pb.keys.KEY_TYPE_ED25519))
        signed = server.ed.Sign(pb.ed.SignRequest(key_id="signer", message=b"many connections"))
        verify = pb.ed.VerifyRequest(public_key=signed.public_key, message=b"many connections",
                                     signature=signed.signature).SerializeToString()

        sockets = []
        self.addCleanup(lambda: [s.close() for s in sockets])
        for _ in range(IDLE):
            s = socket.create_connection(("127.0.0.1", http_port))
            sockets.append(s)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_response(s)[0], 200)
        for _ in range(STALLED):
            s = socket.create_connection(("127.0.0.1", http_port))
            sockets.append(s)
            s.sendall(b"POST /offload.v1.Ed25519Service/Verify HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/proto\r\n")  # and nothing more

        connect_times, grpc_times = [], []
        for _ in range(5):
            t0 = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
            conn.request("POST", "/offload.v1.Ed25519Service/Verify", body=verify,
                         headers={"Content-Type": "application/proto"})
            response = conn.getresponse()
            body = response.read()
            connect_times.append(time.monotonic() - t0)
            conn.close()
            self.assertEqual(response.status, 200)
            # A kept-open HTTP/1.1 answer tells pooling clients the idle timeout (whole seconds).
            self.assertEqual(response.getheader("keep-alive"), "timeout=600")
            parsed = pb.ed.VerifyResponse()
            parsed.ParseFromString(body)
            self.assertTrue(parsed.valid)

            t0 = time.monotonic()
            channel = server.new_channel()
            answer = server.stubs_on(channel).ed.Verify(pb.ed.VerifyRequest.FromString(verify),
                                                        timeout=10)
            grpc_times.append(time.monotonic() - t0)
            channel.close()
            self.assertTrue(answer.valid)

        print("with %d idle and %d stalled HTTP connections: new Connect call %s ms, new gRPC "
              "call %s ms" % (IDLE, STALLED,
                              [round(t * 1000, 1) for t in connect_times],
                              [round(t * 1000, 1) for t in grpc_times]))

        # The idle connections are still served (a sample), and the server counts them all.
        for s in sockets[:IDLE:200]:
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assertEqual(read_response(s)[0], 200)

        # SIGTERM with every connection open: a prompt, clean exit.
        took = server.stop(timeout=150)
        print("SIGTERM with %d connections open: exit 0 after %.2f s" % (len(sockets), took))
        self.assertLess(took, 60.0, "waited for idle connections (--drain_timeout=120s)")


class StoppedProcess(ServerTestCase):
    """A process that is stopped and continued (SIGSTOP/SIGCONT: a debugger, a frozen cgroup or
    container, a paused VM) goes on serving on every port. Linux never restarts epoll_wait after a
    stop signal (EINTR), and the HTTP event loops used to end there, leaving the HTTP and metrics
    ports open and unanswered for good."""

    def test_every_port_answers_after_stop_and_continue(self):
        # The harness picks every port (and picks again if one was taken meanwhile).
        server = Server("stopped", backend="libsodium").start()
        http_port = int(server.flag_value("http_address").rsplit(":", 1)[1])
        metrics_port = int(server.flag_value("metrics_address").rsplit(":", 1)[1])
        self.servers = [server]
        self.addCleanup(server.kill)
        server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="signer",
                                                       type=pb.keys.KEY_TYPE_ED25519), timeout=60)
        signed = server.ed.Sign(pb.ed.SignRequest(key_id="signer", message=b"stop"), timeout=60)
        verify = pb.ed.VerifyRequest(public_key=signed.public_key, message=b"stop",
                                     signature=signed.signature).SerializeToString()
        kept = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)  # keep-alive

        def connect_verify(conn):
            conn.request("POST", "/offload.v1.Ed25519Service/Verify", body=verify,
                         headers={"Content-Type": "application/proto"})
            response = conn.getresponse()
            body = response.read()
            self.assertEqual(response.status, 200, body)
            self.assertTrue(pb.ed.VerifyResponse.FromString(body).valid)

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        connect_verify(kept)
        for round_ in range(3):
            os.kill(server.proc.pid, signal.SIGSTOP)
            # A call sent while the process is stopped waits in the kernel until it goes on.
            waiting = socket.create_connection(("127.0.0.1", http_port))
            waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.2)
            os.kill(server.proc.pid, signal.SIGCONT)
            waiting.settimeout(30)
            self.assertIn(b" 200 ", waiting.recv(4096).split(b"\r\n")[0], "round %d" % round_)
            waiting.close()
            connect_verify(kept)
            fresh = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
            connect_verify(fresh)
            fresh.close()
            metrics = opener.open("http://127.0.0.1:%d/metrics" % metrics_port, timeout=30).read()
            self.assertIn(b"offload_requests_total", metrics)
            self.assertTrue(server.ed.Verify(pb.ed.VerifyRequest.FromString(verify),
                                             timeout=30).valid)
        kept.close()
        server.stop(timeout=60)


if __name__ == "__main__":
    unittest.main()
