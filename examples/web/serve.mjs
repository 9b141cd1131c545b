// A small static file server for the built page (GET and HEAD only, no listing, nothing outside
// its folder). Used by `npm run serve` and by the browser test (tests/e2e/web).
//   node serve.mjs [--root=DIR] [--port=N]      (DIR defaults to dist/, N to 8000; 127.0.0.1 only)
import { readFile } from "node:fs/promises";
import { createServer } from "node:http";
import { dirname, extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const types = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".map": "application/json",
  ".png": "image/png",
};

// Serves `root` on 127.0.0.1:`port` (0: a free port). Resolves to { url, close() }. `routes`
// maps a path to a handler (url, res) for GETs that are not files: a test's token endpoint.
export function serveStatic(root, port = 0, { routes = {} } = {}) {
  const base = resolve(root);
  const server = createServer(async (req, res) => {
    const route = req.method === "GET" && routes[new URL(req.url, "http://x").pathname];
    if (route) {
      route(new URL(req.url, "http://x"), res);
      return;
    }
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { Allow: "GET, HEAD" }).end();
      return;
    }
    let path;
    try {
      path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    } catch {
      res.writeHead(400).end();
      return;
    }
    if (path.endsWith("/")) path += "index.html";
    const file = resolve(join(base, path));
    if (!file.startsWith(base + sep) || !types[extname(file)]) {
      res.writeHead(404).end();
      return;
    }
    try {
      const body = await readFile(file);
      res.writeHead(200, { "Content-Type": types[extname(file)], "Cache-Control": "no-store" });
      res.end(req.method === "HEAD" ? undefined : body);
    } catch {
      res.writeHead(404).end();
    }
  });
  return new Promise((resolvePromise, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => {
      resolvePromise({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () =>
          new Promise((r) => {
            server.close(() => r());
            server.closeAllConnections();
          }),
      });
    });
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const arg = (name, fallback) =>
    process.argv.slice(2).find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
  const here = dirname(fileURLToPath(import.meta.url));
  const { url } = await serveStatic(arg("root", join(here, "dist")), Number(arg("port", "8000")));
  console.log(`serving ${arg("root", "dist/")} at ${url}/ - open ${url}/?server=http://127.0.0.1:8080`);
}
