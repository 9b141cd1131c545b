// Generates JavaScript (with .d.ts) for proto/offload/v1 into gen/ with protoc and
// @bufbuild/protoc-gen-es, as a mobile or web app would. Nothing generated is committed.
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
const files = readdirSync(join(protoDir, "offload/v1"))
  .filter((f) => f.endsWith(".proto"))
  .map((f) => `offload/v1/${f}`);
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
mkdirSync(join(out, "offload/v1"), { recursive: true });
for (const f of readdirSync(join(tmp, "offload/v1"))) {
  renameSync(join(tmp, "offload/v1", f), join(out, "offload/v1", f));
}
rmSync(tmp, { recursive: true, force: true });
console.log(`generated ${files.length} files from ${protoDir} into ${out}`);
