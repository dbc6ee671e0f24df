// The labextension's own drawing work on big payloads, in Node (no browser): the chain
// finding and scene building (shipped layout, or the fast layout for views the shipped
// one does not cover: no layout, every chain expanded), as view.ts runs them per draw.
//   node benchmarks/bench_graph_layout_ts.mjs PAYLOAD.json ...
// bench_graph_draw.py --ts writes the payloads and runs this. Needs labextension's
// node_modules (jlpm install there).
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const ext = path.resolve(here, "..", "labextension");
const require = createRequire(path.join(ext, "package.json"));
const esbuild = require("esbuild");

const out = path.join(
  fs.mkdtempSync(path.join(os.tmpdir(), "sg-bench-")),
  "scene.mjs",
);
await esbuild.build({
  stdin: {
    contents:
      "export { findChains } from './src/chains';\n" +
      "export { buildScene } from './src/scene';\n",
    resolveDir: ext,
    loader: "ts",
  },
  bundle: true,
  platform: "node",
  format: "esm",
  outfile: out,
  logLevel: "warning",
});
const { findChains, buildScene } = await import(pathToFileURL(out).href);

function best(fn, repeats = 3) {
  let t = Infinity;
  let result;
  for (let i = 0; i < repeats; i++) {
    const t0 = performance.now();
    result = fn();
    t = Math.min(t, performance.now() - t0);
  }
  return [t, result];
}

console.log(
  "payload".padEnd(28) +
    "nodes".padStart(7) +
    "chains ms".padStart(11) +
    "shipped ms".padStart(12) +
    "no-layout ms".padStart(14) +
    "expanded ms".padStart(13),
);
for (const file of process.argv.slice(2)) {
  const g = JSON.parse(fs.readFileSync(file, "utf8"));
  const [tc, groups] = best(() => findChains(g, new Set()));
  const groupOf = new Map();
  for (const grp of groups) {
    for (const m of grp.members) {
      groupOf.set(m.id, grp);
    }
  }
  const collapsed = (id) => groupOf.get(id)?.id ?? id;
  const [ts, shipped] = best(() => buildScene(g, collapsed, groupOf));
  if (g.layout && shipped.layout !== "payload") {
    throw new Error(`${file}: the shipped layout was not used`);
  }
  const bare = { ...g, layout: undefined };
  const [tn] = best(() => buildScene(bare, collapsed, groupOf));
  const [te, expanded] = best(() => buildScene(bare, (id) => id, groupOf));
  console.log(
    path.basename(file).padEnd(28) +
      String(expanded.visible.size).padStart(7) +
      tc.toFixed(1).padStart(11) +
      ts.toFixed(1).padStart(12) +
      tn.toFixed(1).padStart(14) +
      te.toFixed(1).padStart(13),
  );
}
