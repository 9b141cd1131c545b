// Builds the page into a folder of static files: builds the TypeScript client (client/ts: its
// code generated from proto/ and compiled, node ../../client/ts/build.mjs), bundles src/main.ts
// with esbuild into app.js, and copies index.html and style.css beside it.
//   node build.mjs [--out=DIR] [--client-only]     (DIR defaults to dist/)
//   OFFLOAD_PROTO_DIR  the repository's proto/ folder (default ../../proto), for the client's build
//   OFFLOAD_PROTOC     protoc to run (default: protoc on PATH)
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
for (const a of args) {
  if (a !== "--client-only" && !a.startsWith("--out=")) {
    console.error(`build.mjs: unknown argument ${a}; usage: node build.mjs [--out=DIR] [--client-only]`);
    process.exit(2);
  }
}
const out = resolve(args.find((a) => a.startsWith("--out="))?.slice(6) ?? join(here, "dist"));

// The client writes its files by atomic renames: two builds at once never see half a file.
execFileSync(process.execPath, [join(here, "../../client/ts/build.mjs")], { stdio: "inherit" });
if (args.includes("--client-only")) process.exit(0);

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
