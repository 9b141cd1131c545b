"""Shared pieces of the observability tests: the e2e harness (imported by path, not copied), a
real Prometheus process, loopback HTTP without proxies, and the promtool runner.

    from obs_support import harness, pb, Prometheus, http_get, scrape
    prom = Prometheus(targets=["127.0.0.1:9464"], rule_files=[ALERTS]).start()
    prom.query('up{job="offload"}')          # the `result` list of /api/v1/query
    prom.stop()

Configuration from the environment (CMake passes it to the tests):
  OFFLOAD_SERVER       path of offload_server (required; see tests/e2e/harness.py)
  OFFLOAD_PROMETHEUS   Prometheus binary (default /usr/bin/prometheus, Debian package `prometheus`)
  OFFLOAD_PROMTOOL     promtool binary (default /usr/bin/promtool, same package)
  OFFLOAD_DEPLOY_DIR   the repository's deploy/ folder (default: ../../deploy from this file)
Everything binds to 127.0.0.1. Prometheus keeps its TSDB in a temporary folder.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "e2e"))

import harness  # noqa: E402  (tests/e2e/harness.py)
from harness import pb  # noqa: E402,F401

PROMETHEUS = os.environ.get("OFFLOAD_PROMETHEUS", "/usr/bin/prometheus")
PROMTOOL = os.environ.get("OFFLOAD_PROMTOOL", "/usr/bin/promtool")
DEPLOY_DIR = os.environ.get("OFFLOAD_DEPLOY_DIR", os.path.join(REPO, "deploy"))
ALERTS = os.path.join(DEPLOY_DIR, "prometheus", "alerts.yml")
PROMETHEUS_YML = os.path.join(DEPLOY_DIR, "prometheus", "prometheus.yml")
DASHBOARD = os.path.join(DEPLOY_DIR, "grafana", "dashboards", "offload.json")

# No proxy for loopback, whatever the environment says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url, timeout=10.0):
    with _OPENER.open(url, timeout=timeout) as resp:
        return resp.status, resp.read()


def scrape(metrics_address):
    status, body = http_get("http://%s/metrics" % metrics_address)
    if status != 200:
        raise AssertionError("GET /metrics on %s: HTTP %d" % (metrics_address, status))
    return body


def parse_exposition(text):
    """{(name, frozenset(labels.items())): value} from the text format (enough for our output)."""
    import re
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            continue
        labels = frozenset(label_re.findall(m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def sample(samples, name, **labels):
    want = set(labels.items())
    values = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    if not values:
        raise AssertionError("no sample %s%s in the scraped output" % (name, labels))
    return sum(values)


def promtool(*args, stdin=None):
    """Runs promtool; returns (exit code, combined output)."""
    run = subprocess.run([PROMTOOL] + list(args), input=stdin, capture_output=True, timeout=60)
    return run.returncode, (run.stdout + run.stderr).decode("utf-8", "replace")


class Prometheus:
    """A real Prometheus server on a free loopback port scraping `targets` as job "offload"."""

    def __init__(self, targets, rule_files=(), interval="1s"):
        self.dir = tempfile.mkdtemp(prefix="prometheus-", dir=harness._WORK)
        self.config_path = os.path.join(self.dir, "prometheus.yml")
        self.address = "127.0.0.1:%d" % harness.free_port()
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self.proc = None
        self.started_at = None
        with open(self.config_path, "w") as f:
            f.write("global:\n  scrape_interval: %s\n  evaluation_interval: %s\n"
                    % (interval, interval))
            if rule_files:
                f.write("rule_files:\n")
                for r in rule_files:
                    f.write("  - %s\n" % json.dumps(os.path.abspath(r)))
            f.write("scrape_configs:\n  - job_name: offload\n    scrape_timeout: %s\n"
                    "    static_configs:\n      - targets: %s\n"
                    % (interval, json.dumps(list(targets))))

    def start(self, timeout=60.0):
        if not os.access(PROMETHEUS, os.X_OK):
            raise RuntimeError("%s is missing: install Debian's `prometheus` package "
                               "(scripts/install-deps.sh)" % PROMETHEUS)
        cmd = [PROMETHEUS,
               "--config.file=" + self.config_path,
               "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
               "--web.listen-address=" + self.address,
               "--storage.tsdb.retention.time=1h",
               "--log.level=warn"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, cwd=self.dir)
        self.started_at = time.time()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited with %s\n%s"
                                   % (self.proc.returncode, self.log_tail()))
            try:
                if http_get("http://%s/-/ready" % self.address, timeout=1.0)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("prometheus not ready after %.0fs\n%s" % (timeout, self.log_tail()))

    def stop(self):
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self._log.close()
        if not harness.KEEP:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                data = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "(no prometheus log)"
        return "---- prometheus log ----\n%s\n---- end ----" % "\n".join(data[-lines:])

    def api(self, path, **params):
        url = "http://%s/api/v1/%s" % (self.address, path)
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        try:
            status, body = http_get(url)
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise AssertionError("%s: HTTP %d %s: %s" % (path, status, doc.get("errorType"),
                                                       doc.get("error")))
        return doc["data"]

    def query(self, expr):
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def wait_for(self, expr, predicate, timeout=60.0, what=""):
        """Polls an instant query until predicate(result) holds; returns the result."""
        deadline = time.monotonic() + timeout
        result = None
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.25)
        raise AssertionError("timed out waiting for %s: %s -> %s\n%s"
                             % (what or "query", expr, result, self.log_tail()))


def value_of(series):
    return float(series["value"][1])
