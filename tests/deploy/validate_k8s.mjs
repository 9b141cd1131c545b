// Offline checks of deploy/k8s, run by ctest (deploy.k8s):
//  1. `kubectl kustomize deploy/k8s` renders (kubectl from $OFFLOAD_KUBECTL; Debian 12's 1.20 works).
//  2. Every rendered object, and every file in deploy/k8s/optional/, validates against the
//     Kubernetes OpenAPI schemas (kubernetes-models) or, for ServiceMonitor, the prometheus-operator
//     CRD schema (@kubernetes-models/prometheus-operator): types, required fields, formats, enums.
//  3. Unknown fields (a misspelt `readinesProbe` passes JSON-schema validation and is dropped by the
//     API server) are caught by type-checking every object against the same packages' TypeScript
//     declarations with tsc: object literals get excess-property checks at every depth.
//  4. The objects fit together: Services, PodDisruptionBudgets, NetworkPolicies and the
//     ServiceMonitor select pods or Services that exist, named ports exist, ConfigMap references
//     resolve, the HPA targets the Deployment, the security settings the issue asks for are on,
//     and terminationGracePeriodSeconds covers the preStop sleep plus the server's --drain_timeout.
//  5. Identity is on: the server's flag file turns on TLS (certificate, key, client CA),
//     --require_identity, bearer tokens (--jwks_file, issuer, audience) and --policy_file, and no
//     forwarded identity; every file those flags (and the router's upstream CA) name is in a
//     mounted ConfigMap key or a documented, non-optional Secret key; the probes are HTTPS GETs
//     (the kubelet's gRPC probe does not speak TLS); the router talks TLS to the replicas.
//  6. The router serves TLS only: every port it listens on is `ssl` (the gRPC one also `http2`,
//     for ALPN h2), its certificate and key come from its own mounted, non-optional Secret
//     (offload-router-tls, not the replicas' offload-tls) and its probes are HTTPS GETs.
// Usage: node validate_k8s.mjs <repository root>
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(process.argv[2] ?? path.join(here, "../.."));
const kubectl = process.env.OFFLOAD_KUBECTL || "kubectl";
const k8sDir = path.join(root, "deploy/k8s");
const errors = [];
const fail = (msg) => errors.push(msg);

function parseDocs(text, where) {
  const out = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) throw new Error(`${where}: YAML: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    if (obj != null) out.push(obj);
  }
  return out;
}

// 1. Render.
const rendered = execFileSync(kubectl, ["kustomize", k8sDir], { encoding: "utf8", maxBuffer: 64 << 20 });
const objects = parseDocs(rendered, "kubectl kustomize").map((o) => ({ obj: o, from: "kustomize" }));
const optionalDir = path.join(k8sDir, "optional");
if (fs.existsSync(optionalDir)) {
  for (const f of fs.readdirSync(optionalDir).filter((f) => /\.ya?ml$/.test(f)).sort()) {
    for (const o of parseDocs(fs.readFileSync(path.join(optionalDir, f), "utf8"), f)) {
      objects.push({ obj: o, from: `optional/${f}` });
    }
  }
}
const label = ({ obj, from }) => `${from}: ${obj.kind}/${obj.metadata?.name}`;

// 2. Schema validation: the model class of each apiVersion/kind; an unknown kind is an error.
function modulePath(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  }
  return `kubernetes-models/${group ? group + "/" : ""}${version}/${kind}`;
}
for (const entry of objects) {
  const { obj } = entry;
  if (!obj.apiVersion || !obj.kind || !obj.metadata?.name) {
    fail(`${label(entry)}: apiVersion, kind and metadata.name are required`);
    continue;
  }
  let Model;
  try {
    Model = (await import(modulePath(obj.apiVersion, obj.kind)))[obj.kind];
  } catch (e) {
    fail(`${label(entry)}: no schema for ${obj.apiVersion} ${obj.kind} (${e.code ?? e.message})`);
    continue;
  }
  try {
    new Model(obj).validate();
  } catch (e) {
    fail(`${label(entry)}: schema: ${e.message}`);
  }
}

// 3. Unknown fields: tsc over `const o: I<Kind> = <object>` for every object.
{
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "offload-k8s-types-"));
  try {
    const lines = [];
    objects.forEach((entry, i) => {
      const { obj } = entry;
      lines.push(`// ${label(entry)}`);
      lines.push(`import type { I${obj.kind} as T${i} } from "${modulePath(obj.apiVersion, obj.kind)}";`);
      lines.push(`export const o${i}: T${i} = ${JSON.stringify(obj, null, 1)};`);
    });
    fs.writeFileSync(path.join(tmp, "objects.ts"), lines.join("\n") + "\n");
    fs.writeFileSync(path.join(tmp, "tsconfig.json"), JSON.stringify({
      compilerOptions: {
        strict: true, noEmit: true, skipLibCheck: true, module: "NodeNext",
        moduleResolution: "NodeNext", target: "ES2020", types: [],
        typeRoots: [], baseUrl: here, paths: { "*": [path.join(here, "node_modules/*")] },
      },
      files: ["objects.ts"],
    }));
    // Resolve the packages from tests/deploy/node_modules.
    fs.symlinkSync(path.join(here, "node_modules"), path.join(tmp, "node_modules"));
    fs.writeFileSync(path.join(tmp, "package.json"), '{"type": "module"}');
    try {
      execFileSync(process.execPath, [path.join(here, "node_modules/typescript/bin/tsc"), "-p", tmp],
                   { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    } catch (e) {
      const text = `${e.stdout ?? ""}${e.stderr ?? ""}`.trim();
      const src = fs.readFileSync(path.join(tmp, "objects.ts"), "utf8").split("\n");
      for (const m of text.matchAll(/objects\.ts\((\d+),\d+\): (error TS\d+: [^\n]+)/g)) {
        // Name the object: the nearest `// from: Kind/name` line above the error.
        let n = Number(m[1]) - 1;
        while (n > 0 && !src[n].startsWith("// ")) n--;
        fail(`${src[n].slice(3)}: fields: ${m[2]}`);
      }
      if (!/objects\.ts\(/.test(text)) fail(`tsc failed: ${text.slice(0, 2000)}`);
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

// 4. Cross-references and the settings the deployment relies on (rendered objects only).
const all = objects.filter((e) => e.from === "kustomize").map((e) => e.obj);
const ofKind = (kind) => all.filter((o) => o.kind === kind);
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const deployments = ofKind("Deployment");
const podsMatching = (sel) => deployments.filter((d) => matches(sel, d.spec.template.metadata.labels));
const containerPorts = (d) => d.spec.template.spec.containers.flatMap((c) => c.ports ?? []);
const namespace = "crypto-offload";

for (const o of all) {
  if (o.kind !== "Namespace" && o.metadata.namespace !== namespace) {
    fail(`${o.kind}/${o.metadata.name}: namespace ${o.metadata.namespace}, want ${namespace}`);
  }
}
const kindsWanted = ["Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                     "NetworkPolicy", "ServiceMonitor", "ConfigMap"];
for (const k of kindsWanted) if (!ofKind(k).length) fail(`no ${k} rendered`);
const server = deployments.find((d) => d.metadata.name === "offload");
if (!server) fail("no Deployment offload");
if (!ofKind("Service").some((s) => s.spec.clusterIP === "None" && podsMatching(s.spec.selector).includes(server))) {
  fail("no headless Service over the offload pods");
}

for (const s of ofKind("Service")) {
  const targets = podsMatching(s.spec.selector);
  if (!targets.length) fail(`Service/${s.metadata.name}: selects no Deployment's pods`);
  for (const p of s.spec.ports) {
    if (typeof p.targetPort === "string" &&
        !targets.every((d) => containerPorts(d).some((cp) => cp.name === p.targetPort))) {
      fail(`Service/${s.metadata.name}: targetPort ${p.targetPort} is not a container port`);
    }
  }
}
for (const pdb of ofKind("PodDisruptionBudget")) {
  if (!podsMatching(pdb.spec.selector.matchLabels).length) fail(`PodDisruptionBudget/${pdb.metadata.name}: selects no pods`);
}
for (const np of ofKind("NetworkPolicy")) {
  const targets = podsMatching(np.spec.podSelector.matchLabels);
  if (!targets.length) fail(`NetworkPolicy/${np.metadata.name}: selects no pods`);
  for (const rule of np.spec.ingress ?? []) {
    for (const p of rule.ports ?? []) {
      if (typeof p.port === "string" && !targets.every((d) => containerPorts(d).some((cp) => cp.name === p.port))) {
        fail(`NetworkPolicy/${np.metadata.name}: port ${p.port} is not a container port`);
      }
    }
  }
}
for (const hpa of ofKind("HorizontalPodAutoscaler")) {
  const t = hpa.spec.scaleTargetRef;
  if (!deployments.some((d) => t.kind === "Deployment" && d.metadata.name === t.name)) {
    fail(`HorizontalPodAutoscaler/${hpa.metadata.name}: target ${t.kind}/${t.name} not rendered`);
  }
  if (!(hpa.spec.minReplicas >= 2)) fail(`HorizontalPodAutoscaler/${hpa.metadata.name}: minReplicas < 2`);
}
for (const sm of ofKind("ServiceMonitor")) {
  const svcs = ofKind("Service").filter((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels));
  if (svcs.length !== 1) fail(`ServiceMonitor/${sm.metadata.name}: selects ${svcs.length} Services, want 1`);
  for (const ep of sm.spec.endpoints) {
    if (!svcs.every((s) => s.spec.ports.some((p) => p.name === ep.port))) {
      fail(`ServiceMonitor/${sm.metadata.name}: port ${ep.port} not on the selected Service`);
    }
  }
  if (svcs[0] && svcs[0].metadata.name !== "offload") {
    fail(`ServiceMonitor/${sm.metadata.name}: job label would be ${svcs[0].metadata.name}; alerts and dashboard expect offload`);
  }
}
const configMaps = new Map(ofKind("ConfigMap").map((c) => [c.metadata.name, c]));
for (const d of deployments) {
  const spec = d.spec.template.spec;
  const name = `Deployment/${d.metadata.name}`;
  for (const v of spec.volumes ?? []) {
    if (v.configMap && !configMaps.has(v.configMap.name)) fail(`${name}: volume ${v.name}: ConfigMap ${v.configMap.name} not rendered`);
  }
  if (spec.securityContext?.runAsNonRoot !== true) fail(`${name}: pod runAsNonRoot is not true`);
  if (spec.automountServiceAccountToken !== false) fail(`${name}: automountServiceAccountToken is not false`);
  for (const c of spec.containers) {
    const sc = c.securityContext ?? {};
    if (sc.readOnlyRootFilesystem !== true) fail(`${name}/${c.name}: readOnlyRootFilesystem is not true`);
    if (sc.allowPrivilegeEscalation !== false) fail(`${name}/${c.name}: allowPrivilegeEscalation is not false`);
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) fail(`${name}/${c.name}: capabilities not dropped`);
    if (!c.resources?.requests || !c.resources?.limits?.memory) fail(`${name}/${c.name}: resources missing`);
    if (!c.readinessProbe || !c.livenessProbe) fail(`${name}/${c.name}: probes missing`);
    for (const probe of [c.readinessProbe, c.livenessProbe, c.startupProbe].filter(Boolean)) {
      const port = probe.httpGet?.port ?? probe.grpc?.port ?? probe.tcpSocket?.port;
      const ok = typeof port === "number" ? (c.ports ?? []).some((p) => p.containerPort === port)
                                          : (c.ports ?? []).some((p) => p.name === port);
      if (!ok) fail(`${name}/${c.name}: a probe uses port ${port}, not a container port`);
    }
  }
}
// 5. Identity. The Secrets are created outside kustomize (deploy/README.md); these are the keys
// the README tells to put in them, so a file path naming any other key is a mistake.
const documentedSecretKeys = {
  "offload-tls": ["tls.crt", "tls.key", "ca.crt"],
  "offload-router-tls": ["tls.crt", "tls.key"],   // kubernetes.io/tls
};
// The volume that `file` of container `c` of Deployment `d` is read from (the deepest mount).
function volumeOf(d, c, file) {
  const m = (c.volumeMounts ?? []).filter((x) => file.startsWith(x.mountPath.replace(/\/?$/, "/")))
    .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  return m && (d.spec.template.spec.volumes ?? []).find((v) => v.name === m.name);
}
// Where `file` comes from in container `c` of Deployment `d`: "" if it is a key of a mounted,
// rendered ConfigMap or a documented key of a non-optional Secret, else why not.
function unmountedFile(d, c, file) {
  const mounts = (c.volumeMounts ?? []).filter((m) => file.startsWith(m.mountPath.replace(/\/?$/, "/")));
  if (!mounts.length) return `${file} is under no volumeMount`;
  const m = mounts.sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  if (m.subPath) return `${file}: volumeMount ${m.name} uses subPath (no updates reach it)`;
  const rel = file.slice(m.mountPath.replace(/\/?$/, "/").length);
  const v = (d.spec.template.spec.volumes ?? []).find((x) => x.name === m.name);
  if (!v) return `${file}: volumeMount ${m.name} names no volume`;
  const src = v.configMap ?? v.secret;
  if (!src) return `${file}: volume ${v.name} is neither a ConfigMap nor a Secret`;
  let key = rel;
  if (src.items) {
    const item = src.items.find((i) => i.path === rel);
    if (!item) return `${file}: volume ${v.name} projects no ${rel}`;
    key = item.key;
  }
  if (src.optional) return `${file}: volume ${v.name} is optional`;
  if (v.configMap) {
    const cm = configMaps.get(v.configMap.name);
    if (!cm) return `${file}: ConfigMap ${v.configMap.name} not rendered`;
    if (!(key in (cm.data ?? {}))) return `${file}: ConfigMap ${v.configMap.name} has no key ${key}`;
  } else {
    const keys = documentedSecretKeys[v.secret.secretName];
    if (!keys) return `${file}: Secret ${v.secret.secretName} is not one the README documents`;
    if (!keys.includes(key)) return `${file}: Secret ${v.secret.secretName} has no documented key ${key} (${keys.join(", ")})`;
  }
  return "";
}
// absl flag file lines -> {name: value}; a bare boolean flag is "true", absl's `--noname` sets
// name to "false"; the last one wins.
function parseFlags(text) {
  const flags = {};
  for (const line of text.split("\n").map((l) => l.trim())) {
    const m = /^--([A-Za-z0-9_]+)(?:=(.*))?$/.exec(line);
    if (!m) continue;
    if (m[2] === undefined && m[1].startsWith("no")) flags[m[1].slice(2)] = "false";
    flags[m[1]] = m[2] ?? "true";
  }
  return flags;
}
const absltrue = (v) => ["true", "1", "yes", "t", "y"].includes(String(v).toLowerCase());

if (server) {
  const spec = server.spec.template.spec;
  const c = spec.containers[0];
  if (!c.startupProbe) fail("Deployment/offload: no startup probe");
  if (c.readinessProbe?.httpGet?.path !== "/readyz") fail("Deployment/offload: readiness is not GET /readyz");
  const env = Object.fromEntries((c.env ?? []).map((e) => [e.name, e]));
  if (!env.OFFLOAD_KEK?.valueFrom?.secretKeyRef) fail("Deployment/offload: OFFLOAD_KEK is not from a Secret");
  if (!spec.volumes.some((v) => v.secret?.secretName === "offload-tls")) fail("Deployment/offload: no TLS Secret volume");
  // The server's flags: the mounted flag file of the offload-flags ConfigMap.
  const flagArg = (c.args ?? []).find((a) => a.startsWith("--flagfile="));
  const flagsVolume = spec.volumes.find((v) => v.configMap && configMaps.get(v.configMap.name)?.metadata.name.startsWith("offload-flags"));
  const flagsText = flagsVolume && Object.values(configMaps.get(flagsVolume.configMap.name).data ?? {})[0];
  if (!flagArg || !flagsText) {
    fail("Deployment/offload: no --flagfile from the offload-flags ConfigMap");
  } else {
    const drain = /^--drain_timeout=(\d+)s$/m.exec(flagsText);
    const sleep = (c.lifecycle?.preStop?.exec?.command ?? []).join(" ").match(/sleep\s+(\d+)/);
    if (!drain) fail("offload.flags: no --drain_timeout=<N>s");
    if (!sleep) fail("Deployment/offload: no preStop sleep");
    if (drain && sleep && !(spec.terminationGracePeriodSeconds > Number(drain[1]) + Number(sleep[1]))) {
      fail(`Deployment/offload: terminationGracePeriodSeconds ${spec.terminationGracePeriodSeconds} <= preStop ${sleep[1]} s + drain ${drain[1]} s`);
    }
    if (process.env.OFFLOAD_FLAGS_OUT) fs.writeFileSync(process.env.OFFLOAD_FLAGS_OUT, flagsText);

    const flags = parseFlags(flagsText);
    const fileFlags = ["tls_cert_file", "tls_key_file", "tls_client_ca_file", "jwks_file", "policy_file"];
    for (const f of fileFlags) {
      if (!flags[f]) {
        fail(`offload.flags: no --${f} (TLS, mTLS, bearer tokens and grants are on in this deploy)`);
        continue;
      }
      const why = unmountedFile(server, c, flags[f]);
      if (why) fail(`Deployment/offload: --${f}: ${why}`);
    }
    if (!absltrue(flags.require_identity)) fail("offload.flags: --require_identity is not on");
    for (const f of ["token_issuer", "token_audience"]) {
      if (!flags[f]) fail(`offload.flags: no --${f} (--jwks_file needs it)`);
    }
    // Client pods reach the replicas directly and could send the header themselves.
    for (const f of ["trusted_proxies", "forwarded_identity_header"]) {
      if (flags[f]) fail(`offload.flags: --${f} is set; identities from headers are not for this deploy`);
    }
    // The ports serve TLS only: the kubelet's gRPC probe cannot reach them, HTTP GETs need HTTPS.
    for (const [what, probe] of [["startup", c.startupProbe], ["readiness", c.readinessProbe], ["liveness", c.livenessProbe]]) {
      if (!probe) continue;
      if (!probe.httpGet) fail(`Deployment/offload: ${what} probe is not an HTTP GET (the kubelet's gRPC and TCP probes do not speak TLS)`);
      else if (probe.httpGet.scheme !== "HTTPS") fail(`Deployment/offload: ${what} probe scheme is ${probe.httpGet.scheme ?? "HTTP"}, want HTTPS`);
      else if (!["/readyz", "/healthz"].includes(probe.httpGet.path)) fail(`Deployment/offload: ${what} probe path ${probe.httpGet.path} needs an identity`);
    }
  }
}

// The router: TLS to the replicas, checked against a CA file mounted into its pod.
const router = deployments.find((d) => d.metadata.name === "offload-nginx");
if (router) {
  const c = router.spec.template.spec.containers[0];
  const confVolume = (router.spec.template.spec.volumes ?? []).find((v) => v.configMap && configMaps.get(v.configMap.name)?.data?.["nginx.conf"]);
  const conf = confVolume ? configMaps.get(confVolume.configMap.name).data["nginx.conf"].replace(/#.*$/gm, "") : "";
  if (!conf) fail("Deployment/offload-nginx: no nginx.conf from a rendered ConfigMap");
  for (const [pass, scheme, prefix] of [["grpc_pass", "grpcs", "grpc"], ["proxy_pass", "https", "proxy"]]) {
    const passes = [...conf.matchAll(new RegExp(`\\b${pass}\\s+(\\w+)://`, "g"))].map((m) => m[1]);
    if (!passes.length || passes.some((s) => s !== scheme)) fail(`offload-nginx nginx.conf: ${pass} ${passes.join(", ")}://, want ${scheme}:// (the replicas serve TLS only)`);
    if (!new RegExp(`\\b${prefix}_ssl_verify\\s+on;`).test(conf)) fail(`offload-nginx nginx.conf: no ${prefix}_ssl_verify on`);
    if (!new RegExp(`\\b${prefix}_ssl_name\\s+\\S+;`).test(conf)) fail(`offload-nginx nginx.conf: no ${prefix}_ssl_name`);
    const ca = new RegExp(`\\b${prefix}_ssl_trusted_certificate\\s+(\\S+);`).exec(conf);
    if (!ca) fail(`offload-nginx nginx.conf: no ${prefix}_ssl_trusted_certificate`);
    else {
      const why = unmountedFile(router, c, ca[1]);
      if (why) fail(`Deployment/offload-nginx: ${prefix}_ssl_trusted_certificate: ${why}`);
    }
  }

  // 6. TLS to clients: bearer tokens must not cross the pod network in clear.
  const listens = [...conf.matchAll(/(?:^|[\s{;])listen\s+([^;]+);/g)].map((m) => m[1].trim().split(/\s+/));
  for (const p of c.ports ?? []) {
    const l = listens.find((x) => x[0].split(":").pop() === String(p.containerPort));
    if (!l) fail(`offload-nginx nginx.conf: no listen on container port ${p.name ?? ""} ${p.containerPort}`);
    else if (p.name === "grpc" && !l.includes("http2")) fail(`offload-nginx nginx.conf: listen ${l.join(" ")} has no http2 (gRPC clients need ALPN h2)`);
  }
  for (const l of listens) {
    if (!l.includes("ssl")) fail(`offload-nginx nginx.conf: listen ${l.join(" ")} is not ssl (tokens would reach the router in clear)`);
  }
  for (const directive of ["ssl_certificate", "ssl_certificate_key"]) {
    const m = new RegExp(`(?:^|[\\s{;])${directive}\\s+(\\S+);`).exec(conf);
    if (!m) {
      fail(`offload-nginx nginx.conf: no ${directive} (the router's own certificate for its clients)`);
      continue;
    }
    const why = unmountedFile(router, c, m[1]);
    if (why) fail(`Deployment/offload-nginx: ${directive}: ${why}`);
    else if (volumeOf(router, c, m[1])?.secret?.secretName === "offload-tls") {
      fail(`Deployment/offload-nginx: ${directive} ${m[1]} is from offload-tls: the replicas' key stays out of the router (offload-router-tls)`);
    }
  }
  for (const [what, probe] of [["startup", c.startupProbe], ["readiness", c.readinessProbe], ["liveness", c.livenessProbe]]) {
    if (!probe) continue;
    if (!probe.httpGet) fail(`Deployment/offload-nginx: ${what} probe is not an HTTP GET`);
    else if (probe.httpGet.scheme !== "HTTPS") fail(`Deployment/offload-nginx: ${what} probe scheme is ${probe.httpGet.scheme ?? "HTTP"}, want HTTPS (the router serves TLS only)`);
  }
} else {
  fail("no Deployment offload-nginx");
}

const kinds = [...new Set(objects.map((e) => e.obj.kind))].sort().join(", ");
if (errors.length) {
  for (const e of errors) console.error(`FAIL ${e}`);
  console.error(`${objects.length} objects checked (${kinds}): ${errors.length} problem(s)`);
  process.exit(1);
}
console.log(`${objects.length} objects valid (${kinds}); kubectl: ${kubectl}`);
