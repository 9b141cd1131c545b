// Builds the page into a folder of static files: generates the TypeScript for proto/offload/v1
// into src/gen/ with protoc and @bufbuild/protoc-gen-es, bundles src/main.ts with esbuild into
// app.js, and copies index.html and style.css beside it.
//   node build.mjs [--out=DIR] [--generate-only]     (DIR defaults to dist/)
//   OFFLOAD_PROTO_DIR  the repository's proto/ folder (default ../../proto)
//   OFFLOAD_PROTOC     protoc to run (default: protoc on PATH)
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
for (const a of args) {
  if (a !== "--generate-only" && !a.startsWith("--out=")) {
    console.error(`build.mjs: unknown argument ${a}; usage: node build.mjs [--out=DIR] [--generate-only]`);
    process.exit(2);
  }
}
const out = resolve(args.find((a) => a.startsWith("--out="))?.slice(6) ?? join(here, "dist"));
const protoDir = resolve(process.env.OFFLOAD_PROTO_DIR ?? join(here, "../../proto"));
const protoc = process.env.OFFLOAD_PROTOC ?? "protoc";

// Generated into a private folder, then moved file by file (atomic renames): two builds at once
// (two build trees running the test) never see a half-written file.
const gen = join(here, "src/gen");
const tmp = join(here, `src/gen-tmp-${process.pid}`);
rmSync(tmp, { recursive: true, force: true });
mkdirSync(tmp, { recursive: true });
const files = readdirSync(join(protoDir, "offload/v1"))
  .filter((f) => f.endsWith(".proto"))
  .map((f) => `offload/v1/${f}`);
execFileSync(
  protoc,
  [
    `--plugin=protoc-gen-es=${join(here, "node_modules/.bin/protoc-gen-es")}`,
    `--es_out=${tmp}`,
    "--es_opt=target=ts,import_extension=js",
    `-I${protoDir}`,
    ...files,
  ],
  { stdio: "inherit" },
);
mkdirSync(join(gen, "offload/v1"), { recursive: true });
for (const f of readdirSync(join(tmp, "offload/v1"))) {
  renameSync(join(tmp, "offload/v1", f), join(gen, "offload/v1", f));
}
rmSync(tmp, { recursive: true, force: true });
console.log(`build.mjs: generated ${files.length} files from ${protoDir} into ${gen}`);
if (args.includes("--generate-only")) process.exit(0);

mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: [join(here, "src/main.ts")],
  outfile: join(out, "app.js"),
  bundle: true,
  format: "esm",
  target: ["es2022"],
  minify: true,
  sourcemap: "linked",
  logLevel: "warning",
});
for (const f of ["index.html", "style.css"]) copyFileSync(join(here, f), join(out, f));
console.log(`build.mjs: ${join(out, "app.js")} (${statSync(join(out, "app.js")).size} bytes), index.html, style.css`);
