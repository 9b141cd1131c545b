// Generates JavaScript (with .d.ts) for proto/offload/v1, and google.rpc.Status and RetryInfo
// (proto/google/rpc: the details of refusals), into gen/ with protoc and @bufbuild/protoc-gen-es,
// as a mobile or web app would. Nothing generated is committed.
//   OFFLOAD_PROTO_DIR  the repository's proto/ folder (default ../../../proto)
//   OFFLOAD_PROTOC     protoc to run (default: protoc on PATH)
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, renameSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const protoDir = resolve(process.env.OFFLOAD_PROTO_DIR ?? join(here, "../../../proto"));
const protoc = process.env.OFFLOAD_PROTOC ?? "protoc";
const out = join(here, "gen");
const plugin = join(here, "node_modules/.bin/protoc-gen-es");

// Generated into a private folder, then moved file by file (atomic renames), so that two test
// runs (two build folders) never see a half-written file.
const tmp = join(here, `gen-tmp-${process.pid}`);
rmSync(tmp, { recursive: true, force: true });
mkdirSync(tmp, { recursive: true });
const dirs = ["offload/v1", "google/rpc"];
const files = dirs.flatMap((dir) =>
  readdirSync(join(protoDir, dir))
    .filter((f) => f.endsWith(".proto"))
    .map((f) => `${dir}/${f}`),
);
execFileSync(
  protoc,
  [
    `--plugin=protoc-gen-es=${plugin}`,
    `--es_out=${tmp}`,
    "--es_opt=target=js+dts,import_extension=js",
    `-I${protoDir}`,
    ...files,
  ],
  { stdio: "inherit" },
);
for (const dir of dirs) {
  mkdirSync(join(out, dir), { recursive: true });
  for (const f of readdirSync(join(tmp, dir))) renameSync(join(tmp, dir, f), join(out, dir, f));
}
rmSync(tmp, { recursive: true, force: true });
console.log(`generated ${files.length} files from ${protoDir} into ${out}`);
