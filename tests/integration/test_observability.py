"""The dashboard and the alert rules, checked against a real Prometheus that scraped real servers.

Starts two offload_servers (tests/e2e/harness.py) with known --metrics_address: "obs" (plain,
with small admission bounds) and "obs-mtls" (mTLS and a grants policy, certificates made here with
openssl as tests/e2e/test_mtls.py does), and Debian's Prometheus scraping both every second with
deploy/prometheus/alerts.yml loaded. Drives traffic with known memo hits and misses, floods of
BatchSign that admission control sheds (queue_full, client_limit; every refusal counted by the
client), and calls that mTLS and the policy refuse (unauthenticated, permission_denied, a
handshake with a certificate of another CA), then:
  - evaluates every query of deploy/grafana/dashboards/offload.json (variables substituted as
    Grafana would: $job and $instance as their "All" value, $__rate_interval and $__range as a
    window covering the whole run) through /api/v1/query: each returns at least one finite value;
  - checks that the hit-ratio panel shows the ratio the traffic produced per cache (within 5
    percentage points; the scraped counters must match the traffic exactly), and that the
    refusal and drop panels show the refusals and drops the traffic produced, by reason;
  - checks that OffloadCallsDropped and OffloadCallsRefused are pending for those reasons (their
    `for` keeps them from firing within the test);
  - checks every recording and alert rule: health "ok" with no error in /api/v1/rules, each
    recording rule's expression and recorded series return data, each alert's operands (its
    expression without comparisons and set operators; absent(x) as x) return data;
  - runs promtool check config / check rules / check metrics (on the scraped text);
  - checks that every offload_* name a query mentions is a metric the server exports, and that
    the metrics table of deploy/prometheus/README.md lists exactly the families it exports.

    OFFLOAD_SERVER=build-obs/bin/offload_server /usr/bin/python3 -m unittest -v \\
        tests/integration/test_observability.py
"""

import collections
import json
import math
import os
import re
import signal
import socket
import struct
import time
import unittest

import grpc
import nacl.bindings
import nacl.public
import nacl.signing

from obs_support import (ALERTS, DASHBOARD, DEPLOY_DIR, PROMETHEUS_YML, Prometheus, harness, pb,
                         parse_exposition, promtool, sample, scrape, value_of)
from test_mtls import Pki  # tests/e2e (on sys.path through obs_support)

T = 60

# Traffic with a known outcome: each round is one batch of distinct items, rounds run one after
# the other, so the first round misses every item and every later round hits every item.
VERIFY_ITEMS, VERIFY_ROUNDS = 32, 4      # hit ratio 3/4
DERIVE_ITEMS, DERIVE_ROUNDS = 16, 3      # hit ratio 2/3
OPEN_ITEMS, OPEN_ROUNDS = 20, 5          # hit ratio 4/5
EXPECTED = {
    "verify": (VERIFY_ITEMS * (VERIFY_ROUNDS - 1), VERIFY_ITEMS),
    "derive": (DERIVE_ITEMS * (DERIVE_ROUNDS - 1), DERIVE_ITEMS),
    "open": (OPEN_ITEMS * (OPEN_ROUNDS - 1), OPEN_ITEMS),
}

HIT_RATIO_PANEL = "Hit ratio per cache"
REFUSALS_PANEL = "Refusals by reason"
DROPS_PANEL = "Drops by reason"
METRICS_README = os.path.join(DEPLOY_DIR, "prometheus", "README.md")

# Admission bounds of the "obs" server (the queue may not be smaller than a batch: max_batch_items
# is lowered to match), and the floods that overrun them, of BatchSign (no memo: the hit ratios
# above stay exact). A QUEUE_FLOOD_ITEMS call admitted leaves no room for a second one
# (queue_full); CLIENT_FLOOD_ITEMS calls fit the queue three at a time but only
# MAX_CLIENT_INFLIGHT may be in flight (client_limit).
MAX_QUEUED_ITEMS, MAX_CLIENT_INFLIGHT = 256, 2
QUEUE_FLOOD_ITEMS, QUEUE_FLOOD_CALLS = 200, 4
CLIENT_FLOOD_ITEMS, CLIENT_FLOOD_CALLS = 64, 6
# Drops of each reason and refusals of each reason to make: over 0.05/s in a 5m rate (15), the
# thresholds of OffloadCallsDropped and OffloadCallsRefused.
DROPS_PER_REASON = 25
REFUSALS_PER_REASON = 25
# The mTLS server's policy: app-c (used for permission_denied) is granted nothing.
POLICY = {"admins": ["admin"],
          "grants": [{"client": "app-a", "keys": ["a-*"], "operations": ["*"]}]}


def grafana_substitute(expr, window):
    """Grafana's variables, as a dashboard covering the test's run would expand them."""
    for var, value in (("$__rate_interval", window), ("${__rate_interval}", window),
                       ("$__range", window), ("${__range}", window),
                       ("$__interval", "1s"), ("${__interval}", "1s"),
                       ("${job}", "offload"), ("$job", "offload"),
                       ("${instance}", ".+"), ("$instance", ".+")):
        expr = expr.replace(var, value)
    if "$" in expr:
        raise AssertionError("unsubstituted variable in %r" % expr)
    return expr


# ---- PromQL operands, for alert expressions that are empty while all is well -------------------

_SPLIT_WORDS = ("and", "or", "unless")
_COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
_MODIFIER = re.compile(r"^\s*(bool\b\s*)?((on|ignoring)\s*\([^)]*\)\s*)?"
                       r"((group_left|group_right)\s*(\([^)]*\))?\s*)?")


def split_operands(expr):
    """Splits `expr` at top-level comparisons and and/or/unless; returns the operand texts.

    Comparison and set operators bind more loosely than arithmetic in PromQL, so every operand is
    a value expression (a scalar literal, or a vector that must have data)."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif depth == 0:
            op = next((o for o in _COMPARISONS if expr.startswith(o, i)), None)
            word = None
            if op is None:
                m = re.match(r"(and|or|unless)\b", expr[i:])
                if m and (i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
                    word = m.group(1)
            if op or word:
                parts.append(expr[start:i])
                i += len(op or word)
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    out = []
    for p in parts:
        p = _MODIFIER.sub("", p, count=1).strip()
        if p:
            out.append(p)
    return out


def is_scalar_literal(text):
    return re.fullmatch(r"[\s0-9.eE+\-*/()]+", text) is not None


def unwrap_absent(text):
    m = re.fullmatch(r"absent\((.*)\)", text.strip(), re.S)
    return m.group(1) if m else text


def offload_names(expr):
    return set(re.findall(r"\b(offload_[a-z0-9_]+)", expr))


def tls_channel(address, pki, who):
    """A TLS channel to `address` trusting the test CA, with client certificate `who` ((cert, key)
    paths) or none."""
    root = pki.read("ca.crt")
    if who is None:
        creds = grpc.ssl_channel_credentials(root_certificates=root)
    else:
        with open(who[0], "rb") as c, open(who[1], "rb") as k:
            creds = grpc.ssl_channel_credentials(root_certificates=root, private_key=k.read(),
                                                 certificate_chain=c.read())
    return grpc.secure_channel(address, creds, options=[
        ("grpc.ssl_target_name_override", "localhost"), ("grpc.enable_http_proxy", 0),
        ("grpc.enable_retries", 0)])


class QuickStartServer(harness.Server):
    """A harness Server whose start waits for its gRPC port to accept connections before it
    builds the channel it checks health with. A channel made before the server listens backs off
    after the refused connection: its first SERVING came up to 15 s after the server's
    server_started line (measured with TLS on this machine)."""

    def wait_serving(self, timeout):
        host, port = self.address.rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
        self.channel.close()
        self.channel = self.new_channel()
        self._bind_stubs(self.channel)
        super().wait_serving(max(1.0, deadline - time.monotonic()))


class TlsServer(QuickStartServer):
    """A harness Server whose own channel (health checks) is TLS with the admin's certificate."""

    def __init__(self, name, pki, admin, args):
        super().__init__(name, args=args)
        self.pki = pki
        self.admin = admin

    def new_channel(self):
        return tls_channel(self.address, self.pki, self.admin)


class ObservabilityTest(harness.ServerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.metrics_address = "127.0.0.1:%d" % harness.free_port()
        cls.server = QuickStartServer("obs", args=[
            "--metrics_address=" + cls.metrics_address,
            "--max_queued_items=%d" % MAX_QUEUED_ITEMS, "--max_batch_items=%d" % MAX_QUEUED_ITEMS,
            "--max_client_inflight=%d" % MAX_CLIENT_INFLIGHT])
        cls.pki = pki = Pki()
        server_cert, server_key = pki.leaf("server", "offload", san="IP:127.0.0.1,DNS:localhost",
                                           server=True)
        cls.ids = {"admin": pki.leaf("admin", "admin"),
                   "app-c": pki.leaf("app-c", "app-c"),  # valid, granted nothing
                   "intruder": pki.leaf("intruder", "admin", ca="other-ca")}
        policy = pki.path("policy.json")
        with open(policy, "w") as f:
            json.dump(POLICY, f)
        cls.tls_metrics_address = "127.0.0.1:%d" % harness.free_port()
        cls.tls_server = TlsServer("obs-mtls", pki, cls.ids["admin"], args=[
            "--metrics_address=" + cls.tls_metrics_address,
            "--tls_cert_file=" + server_cert, "--tls_key_file=" + server_key,
            "--tls_client_ca_file=" + pki.path("ca.crt"), "--policy_file=" + policy,
            "--drain_timeout=5s"])
        cls.servers = [cls.server, cls.tls_server]
        cls.prom = None
        try:
            # Started side by side: each spends seconds measuring the crypto backends.
            harness.start_together(cls.servers)
            cls.prom = Prometheus([cls.metrics_address, cls.tls_metrics_address],
                                  rule_files=[ALERTS]).start()
            # Two scrapes before any traffic: every counter's first sample is 0, so rate() over
            # a window reaching back past it counts exactly the traffic.
            cls.prom.wait_for('count_over_time(up{job="offload"}[5m]) >= 2 and up == 1',
                              lambda r: len(r) == 2, what="two scrapes of each server")
            cls.counts = cls.drive_traffic()
            cls.drops = cls.drive_drops()
            cls.refusals = cls.drive_refusals()
            cls.scraped = scrape(cls.metrics_address).decode()
            cls.samples = parse_exposition(cls.scraped)
            cls.tls_scraped = scrape(cls.tls_metrics_address).decode()
            cls.tls_samples = parse_exposition(cls.tls_scraped)
            # Prometheus has the final values, plus two more scrapes and rule evaluations.
            hits = cls.counts["verify"][0]
            denied = sample(cls.tls_samples, "offload_auth_denied_total")
            dropped = sample(cls.samples, "offload_dropped_total")
            cls.prom.wait_for('sum(offload_memo_hits_total{cache="verify"})',
                              lambda r: r and value_of(r[0]) == hits, what="the final counters")
            cls.prom.wait_for('sum(offload_auth_denied_total)',
                              lambda r: r and value_of(r[0]) == denied, what="the refusals")
            cls.prom.wait_for('sum(offload_dropped_total)',
                              lambda r: r and value_of(r[0]) == dropped, what="the drops")
            time.sleep(2.5)
            cls.window = "%ds" % (int(time.time() - cls.prom.started_at) + 30)
        except BaseException:
            if cls.prom:
                print(cls.prom.log_tail())
                cls.prom.stop()
            cls.server.kill()
            cls.tls_server.kill()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.prom:
            cls.prom.stop()
        for s in cls.servers:
            s.channel.close()  # an idle client connection delays the server's exit
            s.channel = None
            s.signal(signal.SIGTERM)
        for s in cls.servers:
            s.stop()

    # ---- traffic --------------------------------------------------------------------------------

    @classmethod
    def drive_traffic(cls):
        s = cls.server
        # verify: signatures made here, so that the server's own Sign plays no part.
        triples = []
        for i in range(VERIFY_ITEMS):
            sk = nacl.signing.SigningKey.generate()
            msg = b"observability verify item %d" % i
            triples.append(pb.ed.VerifyRequest(public_key=sk.verify_key.encode(), message=msg,
                                               signature=sk.sign(msg).signature))
        for _ in range(VERIFY_ROUNDS):
            resp = s.ed.BatchVerify(pb.ed.BatchVerifyRequest(items=triples), timeout=T)
            assert all(r.valid for r in resp.results), resp
        # derive: one X25519 key, distinct peers.
        s.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="obs-x", type=pb.keys.KEY_TYPE_X25519),
                         timeout=T)
        peers = [nacl.public.PrivateKey.generate().public_key.encode()
                 for _ in range(DERIVE_ITEMS)]
        items = [pb.x.DeriveRequest(key_id="obs-x", peer_public_key=p) for p in peers]
        for _ in range(DERIVE_ROUNDS):
            resp = s.x.BatchDerive(pb.x.BatchDeriveRequest(items=items), timeout=T)
            assert all(r.status.code == harness.OK for r in resp.results), resp
        # open: envelopes sealed here under an imported key (the server's Seal records what it
        # produces, which would make the first open a hit).
        key = os.urandom(32)
        info = s.keys.ImportKey(pb.keys.ImportKeyRequest(
            key_id="obs-aead", type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305, secret=key), timeout=T)
        envelopes = []
        for i in range(OPEN_ITEMS):
            nonce = os.urandom(24)
            ct = nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
                b"observability open item %d" % i, b"aad", nonce, key)
            envelopes.append(b"\x01" + struct.pack(">I", info.current_version) + nonce + ct)
        items = [pb.aead.AeadOpenRequest(key_id="obs-aead", envelope=e, associated_data=b"aad")
                 for e in envelopes]
        for _ in range(OPEN_ROUNDS):
            resp = s.aead.BatchOpen(pb.aead.BatchAeadOpenRequest(items=items), timeout=T)
            assert all(r.status.code == harness.OK for r in resp.results), resp
        # Unary calls and caller errors (none of which looks anything up in a memo), so that the
        # per-method and per-code panels have more than batch methods to show.
        s.keys.CreateKey(pb.keys.CreateKeyRequest(key_id="obs-ed", type=pb.keys.KEY_TYPE_ED25519),
                         timeout=T)
        for i in range(5):
            s.ed.Sign(pb.ed.SignRequest(key_id="obs-ed", message=b"m%d" % i), timeout=T)
            harness.rpc_error(s.ed.Sign, pb.ed.SignRequest(key_id="no-such-key", message=b"m"),
                              timeout=T)
            harness.rpc_error(s.keys.ImportKey, pb.keys.ImportKeyRequest(
                key_id="short", type=pb.keys.KEY_TYPE_AES256_GCM, secret=b"\x01" * 5), timeout=T)
        s.keys.ListKeys(pb.keys.ListKeysRequest(), timeout=T)
        return EXPECTED

    @classmethod
    def flood(cls, items, calls):
        """`calls` BatchSign calls of `items` items sent at once; counts them by outcome: ok, or
        the admission refusal (queue_full, client_limit) that the error message names."""
        req = pb.ed.BatchSignRequest(items=[
            pb.ed.SignRequest(key_id="obs-ed", message=b"flood %d" % i) for i in range(items)])
        futures = [cls.server.ed.BatchSign.future(req, timeout=T) for _ in range(calls)]
        got = collections.Counter()
        for f in futures:
            try:
                f.result()
                got["ok"] += 1
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                if "server overloaded" in e.details():
                    got["queue_full"] += 1
                elif "over its concurrency limit" in e.details():
                    got["client_limit"] += 1
                else:
                    raise AssertionError("unexpected refusal: %s" % e.details())
        return got

    @classmethod
    def drive_drops(cls):
        """Floods until each of queue_full and client_limit has DROPS_PER_REASON refusals or more;
        returns what the client saw (the server's counters must say the same)."""
        total = collections.Counter()
        for reason, items, calls in (("queue_full", QUEUE_FLOOD_ITEMS, QUEUE_FLOOD_CALLS),
                                     ("client_limit", CLIENT_FLOOD_ITEMS, CLIENT_FLOOD_CALLS)):
            floods = 0
            while total[reason] < DROPS_PER_REASON:
                floods += 1
                if floods > 500:
                    raise AssertionError("500 floods made only %d %s refusals: %s"
                                         % (total[reason], reason, dict(total)))
                total.update(cls.flood(items, calls))
            print("  %d floods of %d x BatchSign(%d) for %s" % (floods, calls, items, reason))
        print("  drops seen by the client: %s" % dict(total))
        return total

    @classmethod
    def drive_refusals(cls):
        """REFUSALS_PER_REASON Sign calls without a client certificate (unauthenticated) and with
        one the policy grants nothing (permission_denied), and one call over a certificate of
        another CA (its handshake is refused: handshake_refused, once or more as gRPC reconnects)."""
        s = cls.tls_server
        req = pb.ed.SignRequest(key_id="a-ed", message=b"m")
        for who, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                          (cls.ids["app-c"], grpc.StatusCode.PERMISSION_DENIED),
                          (cls.ids["intruder"], grpc.StatusCode.UNAVAILABLE)):
            channel = tls_channel(s.address, cls.pki, who)
            try:
                stub = s.stubs_on(channel)
                for _ in range(REFUSALS_PER_REASON if code != grpc.StatusCode.UNAVAILABLE else 1):
                    e = harness.rpc_error(stub.ed.Sign, req, timeout=T)
                    assert e is not None and e.code() == code, (code, e)
            finally:
                channel.close()
        return {"unauthenticated": REFUSALS_PER_REASON, "permission_denied": REFUSALS_PER_REASON}

    # ---- helpers --------------------------------------------------------------------------------

    def dashboard(self):
        with open(DASHBOARD) as f:
            return json.load(f)

    def targets(self):
        """(panel title, target) for every query target of every panel, rows included."""
        out = []

        def walk(panels):
            for p in panels:
                for t in p.get("targets", []):
                    out.append((p.get("title", "?"), t))
                walk(p.get("panels", []))
        walk(self.dashboard()["panels"])
        return out

    def assert_has_data(self, what, expr):
        result = self.prom.query(expr)
        self.assertTrue(result, "%s returned no data: %s" % (what, expr))
        finite = [value_of(r) for r in result if math.isfinite(value_of(r))]
        self.assertTrue(finite, "%s returned only NaN/Inf: %s -> %s" % (what, expr, result))
        return result

    # ---- the traffic did what we think ----------------------------------------------------------

    def test_scraped_counters_match_traffic(self):
        for cache, (hits, misses) in self.counts.items():
            with self.subTest(cache=cache):
                self.assertEqual(sample(self.samples, "offload_memo_hits_total", cache=cache), hits)
                self.assertEqual(sample(self.samples, "offload_memo_misses_total", cache=cache),
                                 misses)
        self.assertEqual(sample(self.samples, "offload_items_total", method="BatchVerify",
                                result="ok"), VERIFY_ITEMS * VERIFY_ROUNDS)
        self.assertEqual(sample(self.samples, "offload_requests_total", method="BatchVerify",
                                code="OK"), VERIFY_ROUNDS)
        self.assertEqual(sample(self.samples, "offload_requests_total", method="Sign",
                                code="NOT_FOUND"), 5)
        self.assertEqual(sample(self.samples, "offload_ready"), 1)
        self.assertEqual(sample(self.samples, "offload_keys"), 3)

    def test_scraped_refusals_and_drops_match_traffic(self):
        for reason in ("queue_full", "client_limit"):
            with self.subTest(reason=reason):
                self.assertEqual(sample(self.samples, "offload_dropped_total", reason=reason),
                                 self.drops[reason])
        self.assertEqual(sample(self.samples, "offload_dropped_total", reason="deadline"), 0)
        self.assertEqual(sample(self.samples, "offload_requests_total", method="BatchSign",
                                code="RESOURCE_EXHAUSTED"),
                         self.drops["queue_full"] + self.drops["client_limit"])
        self.assertEqual(sample(self.samples, "offload_requests_total", method="BatchSign",
                                code="OK"), self.drops["ok"])
        self.assertEqual(sample(self.samples, "offload_queued_items"), 0)  # all finished
        self.assertEqual(sample(self.samples, "offload_auth_denied_total"), 0)  # no TLS here
        for reason, n in self.refusals.items():
            with self.subTest(reason=reason):
                self.assertEqual(sample(self.tls_samples, "offload_auth_denied_total",
                                        reason=reason), n)
        self.assertGreaterEqual(sample(self.tls_samples, "offload_auth_denied_total",
                                       reason="handshake_refused"), 1)
        self.assertEqual(sample(self.tls_samples, "offload_requests_total", method="Sign",
                                code="UNAUTHENTICATED"), self.refusals["unauthenticated"])

    # ---- the dashboard --------------------------------------------------------------------------

    def test_dashboard_is_provisioning_ready(self):
        d = self.dashboard()
        self.assertIsNone(d.get("id"), "provisioned dashboards carry no numeric id")
        self.assertTrue(d.get("uid"))
        variables = {v["name"]: v for v in d["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        ids = []

        def walk(panels):
            for p in panels:
                ids.append(p["id"])
                self.assertIn("gridPos", p)
                if p["type"] != "row":
                    self.assertEqual(p["datasource"], {"type": "prometheus",
                                                       "uid": "${datasource}"}, p["title"])
                    self.assertTrue(p["targets"], p["title"])
                for t in p.get("targets", []):
                    self.assertEqual(t["datasource"]["uid"], "${datasource}", p["title"])
                    self.assertTrue(t["expr"].strip(), p["title"])
                walk(p.get("panels", []))
        walk(d["panels"])
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        titles = {p.get("title") for p in d["panels"]}
        for needed in ("Request rate by method", "Non-OK responses by code",
                       "p50 latency by method", "p99 latency by method", HIT_RATIO_PANEL,
                       "Memo bytes vs capacity", "Worker queue depth", "Busy workers / workers",
                       "Key store operations", "Key store load time", "Managed keys",
                       "Crypto operations", "Resident memory", "Build", REFUSALS_PANEL,
                       DROPS_PANEL, "Queued items", "Front-door defences by reason",
                       "Front-door memory held"):
            self.assertIn(needed, titles)

    def test_every_dashboard_query_returns_data(self):
        targets = self.targets()
        self.assertGreater(len(targets), 20)
        for title, t in targets:
            expr = grafana_substitute(t["expr"], self.window)
            with self.subTest(panel=title, ref=t["refId"]):
                result = self.assert_has_data("panel %r %s" % (title, t["refId"]), expr)
                print("  dashboard %-45s %s: %d series, e.g. %s = %s"
                      % (title, t["refId"], len(result), result[0]["metric"],
                         result[0]["value"][1]))

    def test_dashboard_variables_have_values(self):
        for v in self.dashboard()["templating"]["list"]:
            if v["type"] != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q)
            self.assertIsNotNone(m, "unexpected variable query %r" % q)
            match = grafana_substitute(m.group(1), self.window)
            series = self.prom.api("series", **{"match[]": match})
            values = {s.get(m.group(2)) for s in series} - {None}
            with self.subTest(variable=v["name"]):
                self.assertTrue(values, "variable %s: %s has no values" % (v["name"], q))
                print("  variable %s = %s" % (v["name"], sorted(values)))

    def test_hit_ratio_panel_matches_traffic(self):
        [(title, target)] = [(ti, t) for ti, t in self.targets() if ti == HIT_RATIO_PANEL]
        result = self.prom.query(grafana_substitute(target["expr"], self.window))
        shown = {r["metric"].get("cache"): value_of(r) for r in result}
        for cache, (hits, misses) in self.counts.items():
            expected = hits / (hits + misses)
            with self.subTest(cache=cache):
                self.assertIn(cache, shown)
                print("  hit ratio %-6s expected %.4f (%d hits, %d misses), panel %.4f"
                      % (cache, expected, hits, misses, shown[cache]))
                self.assertAlmostEqual(shown[cache], expected, delta=0.05)

    def panel_counts_by_reason(self, title, instance, ref="A"):
        """The panel's per-second rates (query `ref`) integrated over the run (rate -> increase),
        by reason, evaluated at the instant of `instance`'s last scrape: there increase()
        extrapolates neither past the last sample nor (from a first sample of 0) before the first
        one, so it is the exact count."""
        [(_, target)] = [(ti, t) for ti, t in self.targets() if ti == title and t["refId"] == ref]
        expr = grafana_substitute(target["expr"].replace("rate(", "increase("), self.window)
        [last] = self.prom.query('timestamp(up{instance="%s"})' % instance)
        data = self.prom.api("query", query=expr, time=last["value"][1])
        return {r["metric"].get("reason"): float(r["value"][1]) for r in data["result"]}

    def test_refusal_and_drop_panels_match_traffic(self):
        shown = self.panel_counts_by_reason(DROPS_PANEL, self.metrics_address)
        print("  %s: %s (traffic: %s)" % (DROPS_PANEL, shown, dict(self.drops)))
        self.assertEqual(shown, {"queue_full": self.drops["queue_full"],
                                 "client_limit": self.drops["client_limit"], "deadline": 0,
                                 "client_gone": 0, "answers_unread": 0})
        shown = self.panel_counts_by_reason(REFUSALS_PANEL, self.tls_metrics_address)
        handshakes = sample(self.tls_samples, "offload_auth_denied_total",
                            reason="handshake_refused")
        print("  %s: %s (traffic: %s, %d handshakes)"
              % (REFUSALS_PANEL, shown, self.refusals, handshakes))
        self.assertEqual(shown, dict(self.refusals, handshake_refused=handshakes))
        # Query B: refused bearer tokens by reason; this server takes none, so every reason is 0.
        tokens = self.panel_counts_by_reason(REFUSALS_PANEL, self.tls_metrics_address, ref="B")
        self.assertIn("expired", tokens)
        self.assertEqual(set(tokens.values()), {0.0}, tokens)

    def test_queries_name_exported_metrics(self):
        exported = {name for name, _ in self.samples}
        families = set(re.findall(r"^# TYPE (\S+)", self.scraped, re.M))
        known = exported | families
        exprs = [t["expr"] for _, t in self.targets()]
        with open(ALERTS) as f:
            exprs.append(f.read())
        for expr in exprs:
            for name in offload_names(expr):
                self.assertIn(name, known, "%s is not exported by the server" % name)

    # ---- the rules ------------------------------------------------------------------------------

    def rules(self):
        groups = self.prom.api("rules")["groups"]
        return [r for g in groups for r in g["rules"]]

    def test_rules_loaded_healthy_and_evaluated(self):
        with open(ALERTS) as f:
            declared = re.findall(r"^\s*- (?:record|alert):\s*(\S+)", f.read(), re.M)
        self.assertGreater(len(declared), 10)
        # Every rule has been evaluated after the traffic (evaluation_interval is 1s).
        deadline = time.monotonic() + 30
        while True:
            rules = self.rules()
            if all(r.get("lastEvaluation", "").startswith("2") and
                   r.get("health") == "ok" for r in rules) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual(sorted(r["name"] for r in rules), sorted(declared))
        for r in rules:
            with self.subTest(rule=r["name"]):
                self.assertEqual(r["health"], "ok", "%s: %s" % (r["name"], r.get("lastError")))
                self.assertFalse(r.get("lastError"), r.get("lastError"))

    def test_every_recording_rule_returns_data(self):
        for r in self.rules():
            if r["type"] != "recording":
                continue
            with self.subTest(rule=r["name"]):
                result = self.assert_has_data("recording rule %s" % r["name"], r["query"])
                self.assert_has_data("recorded series %s" % r["name"], r["name"])
                print("  record %-45s %d series, e.g. %s" % (r["name"], len(result),
                                                            result[0]["value"][1]))

    def test_every_alert_expression_evaluates(self):
        for r in self.rules():
            if r["type"] != "alerting":
                continue
            with self.subTest(alert=r["name"]):
                whole = self.prom.query(r["query"])  # legitimately empty while all is well
                operands = [unwrap_absent(p) for p in split_operands(r["query"])
                            if not is_scalar_literal(p)]
                self.assertTrue(operands, r["query"])
                for p in operands:
                    result = self.assert_has_data("alert %s operand" % r["name"], p)
                    print("  alert %-30s operand %-70s -> %s" % (
                        r["name"], " ".join(p.split())[:70],
                        ", ".join(r_["value"][1] for r_ in result[:3])))
                print("  alert %-30s whole expression: %d series (%s)"
                      % (r["name"], len(whole), r["state"]))

    def test_refusal_and_drop_alerts_are_pending(self):
        """The drops and refusals above are over the alerts' thresholds: each alert is pending
        for the reasons the traffic produced (firing would take its `for`, 10-15 minutes)."""
        expected = {"OffloadCallsDropped": {"queue_full", "client_limit"},
                    "OffloadCallsRefused": {"unauthenticated", "permission_denied"}}
        deadline = time.monotonic() + 30
        while True:
            pending = collections.defaultdict(set)
            for a in self.prom.api("alerts")["alerts"]:
                if a["labels"]["alertname"] in expected and a["state"] == "pending":
                    pending[a["labels"]["alertname"]].add(a["labels"]["reason"])
            if all(reasons <= pending[name] for name, reasons in expected.items()):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for name, reasons in expected.items():
            with self.subTest(alert=name):
                print("  alert %s pending for %s" % (name, sorted(pending[name])))
                self.assertLessEqual(reasons, pending[name])

    def test_no_alert_fires(self):
        firing = [a for a in self.prom.api("alerts")["alerts"] if a["state"] == "firing"]
        self.assertEqual(firing, [])

    def test_metrics_table_lists_every_exported_family(self):
        with open(METRICS_README) as f:
            text = f.read()
        table = text[text.index("| family | type | labels |"):]
        table = table[:table.index("\n\n")]
        listed = set(re.findall(r"`((?:offload|exposer)_[a-z0-9_]+)`", table))
        exported = set(re.findall(r"^# TYPE (\S+)", self.scraped + self.tls_scraped, re.M))
        print("  metrics table: %d families, the servers export %d" % (len(listed), len(exported)))
        self.assertEqual(sorted(exported - listed), [], "exported but not in the metrics table")
        self.assertEqual(sorted(listed - exported), [], "in the metrics table but not exported")

    # ---- promtool -------------------------------------------------------------------------------

    def test_promtool_check_config(self):
        for path in (self.prom.config_path, PROMETHEUS_YML):
            with self.subTest(config=path):
                rc, out = promtool("check", "config", path)
                print("  promtool check config %s (exit %d):\n%s" % (path, rc, out))
                self.assertEqual(rc, 0, out)
                self.assertIn("1 rule files found", out)

    def test_promtool_check_rules(self):
        rc, out = promtool("check", "rules", ALERTS)
        print("  promtool check rules (exit %d):\n%s" % (rc, out))
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS", out)

    def test_promtool_check_metrics(self):
        rc, out = promtool("check", "metrics", stdin=self.scraped.encode())
        print("  promtool check metrics (exit %d): %s" % (rc, out.strip() or "(no findings)"))
        self.assertEqual(rc, 0, out)
        # Lint findings about prometheus-cpp's own exposer_* families would be tolerated;
        # ours must have none.
        ours = [line for line in out.splitlines() if line.startswith("offload_")]
        self.assertEqual(ours, [], out)


class OpenMissCountedTest(harness.ServerTestCase):
    """The first open of a key whose open memo does not exist yet (new key, or just rotated or
    deleted) counts as a miss in offload_memo_misses_total{cache="open"}."""

    def test_first_open_of_a_key_counts_a_miss(self):
        address = "127.0.0.1:%d" % harness.free_port()
        server = harness.Server("obs-open-miss", args=["--metrics_address=" + address])
        self.servers = [server]
        server.start()
        try:
            key = os.urandom(32)
            info = server.keys.ImportKey(pb.keys.ImportKeyRequest(
                key_id="k", type=pb.keys.KEY_TYPE_XCHACHA20_POLY1305, secret=key), timeout=T)
            nonce = os.urandom(24)
            envelope = (b"\x01" + struct.pack(">I", info.current_version) + nonce +
                        nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(
                            b"p", b"", nonce, key))
            resp = server.aead.Open(pb.aead.AeadOpenRequest(key_id="k", envelope=envelope),
                                    timeout=T)
            self.assertFalse(resp.memo_hit)
            samples = parse_exposition(scrape(address).decode())
            self.assertEqual(sample(samples, "offload_memo_misses_total", cache="open"), 1)
        finally:
            server.stop()


class OperandSplitTest(unittest.TestCase):
    def test_split(self):
        self.assertEqual(split_operands('a{x=~"p|q",y!="z"} > (14.4 * 0.001) and b > 1'),
                         ['a{x=~"p|q",y!="z"}', "(14.4 * 0.001)", "b", "1"])
        self.assertEqual(split_operands("x / y > 0.9 and on (job) sum(z) > 0"),
                         ["x / y", "0.9", "sum(z)", "0"])
        self.assertEqual(split_operands("rate(operand[5m]) < 0.5 * standard"),
                         ["rate(operand[5m])", "0.5 * standard"])
        self.assertTrue(is_scalar_literal("(14.4 * 0.001)"))
        self.assertEqual(unwrap_absent('absent(up{job="offload"})'), 'up{job="offload"}')


if __name__ == "__main__":
    unittest.main()
