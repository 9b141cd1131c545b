// Builds the package: generates TypeScript for proto/offload/v1 and google/rpc (status,
// error_details) into src/gen/ with protoc and @bufbuild/protoc-gen-es, then compiles src/ with
// tsc into dist/ (ES2022 modules with .d.ts). Nothing generated is committed: protoc comes from
// Debian's protobuf-compiler (scripts/install-deps.sh), protoc-gen-es from `npm ci`, so a fresh
// checkout builds offline once both are installed.
//   node build.mjs [--generate-only]
//   OFFLOAD_PROTO_DIR  the repository's proto/ folder (default ../../proto)
//   OFFLOAD_PROTOC     protoc to run (default: protoc on PATH)
// Several builds may run at once (the tests of two build trees, the examples): each writes into a
// private folder and moves its files into place one by one (atomic renames), so none ever reads
// a half-written file. The private folder of the generated code lies outside src/: tsc takes
// every file under src/, and another build's folder there vanished under it (TS6053).
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
for (const a of args) {
  if (a !== "--generate-only") {
    console.error(`build.mjs: unknown argument ${a}; usage: node build.mjs [--generate-only]`);
    process.exit(2);
  }
}
const protoDir = resolve(process.env.OFFLOAD_PROTO_DIR ?? join(here, "../../proto"));
const protoc = process.env.OFFLOAD_PROTOC ?? "protoc";

// Moves every file under `from` to the same place under `to`, then removes `from`.
function moveTree(from, to) {
  for (const entry of readdirSync(from)) {
    const src = join(from, entry);
    const dst = join(to, entry);
    if (statSync(src).isDirectory()) {
      mkdirSync(dst, { recursive: true });
      moveTree(src, dst);
    } else {
      renameSync(src, dst);
    }
  }
  rmSync(from, { recursive: true, force: true });
}

const protos = [
  ...readdirSync(join(protoDir, "offload/v1")).filter((f) => f.endsWith(".proto")).map((f) => `offload/v1/${f}`),
  "google/rpc/status.proto",
  "google/rpc/error_details.proto",
];
const genTmp = join(here, `.gen-tmp-${process.pid}`);
rmSync(genTmp, { recursive: true, force: true });
mkdirSync(genTmp, { recursive: true });
execFileSync(
  protoc,
  [
    `--plugin=protoc-gen-es=${join(here, "node_modules/.bin/protoc-gen-es")}`,
    `--es_out=${genTmp}`,
    "--es_opt=target=ts,import_extension=js",
    `-I${protoDir}`,
    ...protos,
  ],
  { stdio: "inherit" },
);
mkdirSync(join(here, "src/gen"), { recursive: true });
moveTree(genTmp, join(here, "src/gen"));
console.log(`build.mjs: generated ${protos.length} files from ${protoDir} into src/gen`);
if (args.includes("--generate-only")) process.exit(0);

const distTmp = join(here, `dist-tmp-${process.pid}`);
rmSync(distTmp, { recursive: true, force: true });
const tsc = join(here, "node_modules/typescript/bin/tsc");
if (!existsSync(tsc)) throw new Error(`build.mjs: ${tsc} is missing: run npm ci in ${here}`);
try {
  execFileSync(process.execPath, [tsc, "-p", here, "--outDir", distTmp], { stdio: "inherit" });
} catch (e) {
  rmSync(distTmp, { recursive: true, force: true });
  throw e;
}
mkdirSync(join(here, "dist"), { recursive: true });
moveTree(distTmp, join(here, "dist"));
console.log(`build.mjs: compiled src/ into ${relative(process.cwd(), join(here, "dist")) || "."}`);
