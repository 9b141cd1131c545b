"""Flags out of their range stop the server at start, by name.

Each case runs offload_server with one wrong flag (and a data folder that does not exist, so a
server that got past the flag checks would fail elsewhere, later, for another reason): it must
exit 1 with one `server_failed` line whose error names the flag and the accepted range
("<flag>: expected <range>, got <value>"). Then one server starts with the values README gives a
meaning to at the edges (0 = off, one per core, no PING too soon...), and serves.

    OFFLOAD_SERVER=build/bin/offload_server /usr/bin/python3 -m unittest -v test_start_flags.py
"""

import json
import subprocess
import unittest

from harness import Server, pb

# (argument, the flag named, the accepted range as the error states it, the value it quotes)
REFUSED = [
    ("--log_requests_sample_rate=2", "log_requests_sample_rate", "a fraction from 0 to 1", "2"),
    ("--log_requests_sample_rate=-0.5", "log_requests_sample_rate", "a fraction from 0 to 1",
     "-0.5"),
    ("--workers=-1", "workers", "0 (one per core) or more", "-1"),
    ("--inline_max_call_us=-1", "inline_max_call_us", "0 (every call that misses the memo goes to "
     "the pool) or more", "-1"),
    ("--inline_turn_budget_us=-5", "inline_turn_budget_us", "0 or more", "-5"),
    ("--http2_min_ping_interval=-1s", "http2_min_ping_interval", "0 (no PING is too soon) or more",
     "-1s"),
    ("--http2_idle_ping_interval=-1s", "http2_idle_ping_interval",
     "0 (no PING is too soon) or more", "-1s"),
    ("--http2_max_ping_strikes=-1", "http2_max_ping_strikes", "0 (off) or more", "-1"),
    ("--http2_premature_reset_lifetime=0", "http2_premature_reset_lifetime",
     "a duration above 0 (--http2_premature_reset_streams=0 turns the rule off)", "0"),
    ("--key_deletion_wait=-1s", "key_deletion_wait", "0 (wipe at once) to 87840h (10 years)",
     "-1s"),
    ("--backend=foo", "backend", "auto, libsodium or openssl", '"foo"'),
    ("--drain_timeout=-1s", "drain_timeout", "0 (no wait for calls in flight) to 1h", "-1s"),
    ("--drain_timeout=61m", "drain_timeout", "0 (no wait for calls in flight) to 1h", "1h1m"),
    ("--drain_timeout=inf", "drain_timeout", "0 (no wait for calls in flight) to 1h", "inf"),
    # The HTTP flags, once one sentence for all, each by name.
    ("--http_threads=-1", "http_threads", "0 (one per core, at most 4) or more", "-1"),
    ("--http_max_connections=-1", "http_max_connections", "0 (no bound) or more", "-1"),
    ("--http_max_header_bytes=1023", "http_max_header_bytes", "1024 or more", "1023"),
    ("--http_read_timeout=0", "http_read_timeout", "a duration above 0", "0"),
    ("--http_idle_timeout=-1s", "http_idle_timeout", "a duration above 0", "-1s"),
    ("--http_send_timeout=0", "http_send_timeout", "a duration above 0", "0"),
    ("--http_connection_budget_bytes=-1", "http_connection_budget_bytes", "0 (no bound) or more",
     "-1"),
    ("--http_connection_answer_budget_bytes=-1", "http_connection_answer_budget_bytes",
     "0 (no bound) or more", "-1"),
    ("--http_memory_budget_bytes=-1", "http_memory_budget_bytes", "0 (no bound) or more", "-1"),
    ("--http2_max_concurrent_streams=0", "http2_max_concurrent_streams", "1 or more", "0"),
    ("--http2_stream_window_bytes=65534", "http2_stream_window_bytes", "65535 or more", "65534"),
    ("--http2_connection_window_bytes=1", "http2_connection_window_bytes", "65535 or more", "1"),
    ("--http2_reset_burst=0", "http2_reset_burst", "1 or more", "0"),
    ("--http2_reset_rate=0", "http2_reset_rate", "1 or more", "0"),
    ("--http2_max_continuations=0", "http2_max_continuations", "1 or more", "0"),
    ("--http2_max_outbound_ack=0", "http2_max_outbound_ack", "1 or more", "0"),
    ("--http2_max_settings=0", "http2_max_settings", "1 or more", "0"),
    ("--http2_premature_reset_streams=-1", "http2_premature_reset_streams", "0 (off) or more",
     "-1"),
    ("--http2_no_progress_burst=0", "http2_no_progress_burst", "1 or more", "0"),
    ("--http2_no_progress_rate=0", "http2_no_progress_rate", "1 or more", "0"),
    ("--grpc_max_concurrent_streams=-1", "grpc_max_concurrent_streams",
     "0 (--http2_max_concurrent_streams) or more", "-1"),
]

# Values at the edges of the ranges, each with a meaning README states.
EDGES = ["--workers=0", "--inline_max_call_us=0", "--inline_turn_budget_us=0",
         "--http2_min_ping_interval=0", "--http2_idle_ping_interval=0",
         "--http2_max_ping_strikes=0", "--http2_premature_reset_streams=0",
         "--log_requests_sample_rate=1", "--key_deletion_wait=0", "--drain_timeout=0",
         "--http_threads=0",
         "--http_max_connections=0", "--http_memory_budget_bytes=0",
         "--grpc_max_concurrent_streams=0"]


class StartFlagsTest(unittest.TestCase):
    def start_refused(self, arg):
        """Runs the server with `arg`; returns its exit code and the errors of its server_failed
        lines."""
        binary = Server("flags").binary
        run = subprocess.run(
            [binary, arg, "--data_dir=/nonexistent/start-flags-test", "--memory_limit_file=",
             "--grpc_address=127.0.0.1:0", "--http_address=127.0.0.1:0", "--metrics_address="],
            capture_output=True, text=True, timeout=60)
        errors = []
        for text in run.stderr.splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if line.get("event") == "server_failed":
                errors.append(line.get("error"))
        return run.returncode, errors, run.stderr

    def test_out_of_range_flags_are_refused_by_name(self):
        for arg, flag, expected, got in REFUSED:
            with self.subTest(arg=arg):
                rc, errors, stderr = self.start_refused(arg)
                self.assertEqual(rc, 1, stderr)
                self.assertEqual(errors, ["INVALID_ARGUMENT: %s: expected %s, got %s"
                                          % (flag, expected, got)], stderr)

    def test_values_at_the_edges_start(self):
        server = Server("flags-edges", backend="libsodium", args=EDGES).start()
        try:
            self.assertEqual(server.health_status(), pb.health.HealthCheckResponse.SERVING)
            server.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="k",
                                                           type=pb.keys.KEY_TYPE_ED25519),
                                  timeout=10)
            s = server.ed.Sign(pb.ed.SignRequest(key_id="k", message=b"m"), timeout=10)
            v = server.ed.Verify(pb.ed.VerifyRequest(public_key=s.public_key, message=b"m",
                                                     signature=s.signature), timeout=10)
            self.assertTrue(v.valid)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main()
