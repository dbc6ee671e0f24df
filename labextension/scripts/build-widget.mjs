// Bundle the drawing module as one ES module for the Inspector's anywidget front end:
// symgrad/jupyter/static/inspector.js (build output, not committed). The CSS, KaTeX's
// included, is bundled first (woff2 fonts inlined as data URLs) and embedded as a string,
// so the widget needs a single file and no network.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const outFile = path.resolve(
  root,
  '..',
  'symgrad',
  'jupyter',
  'static',
  'inspector.js'
);
const dev = process.argv.includes('--dev');

const cssResult = await esbuild.build({
  entryPoints: [path.join(root, 'style', 'widget.css')],
  bundle: true,
  write: false,
  minify: true,
  logLevel: 'warning',
  loader: { '.woff2': 'dataurl' },
  // Browsers take the first format they support (woff2); the other two stay as links.
  external: ['*.woff', '*.ttf'],
  outdir: 'out'
});
const css = cssResult.outputFiles.find(f => f.path.endsWith('.css')).text;

const inlineCss = {
  name: 'inline-css',
  setup(build) {
    build.onResolve({ filter: /^symgrad-inline-css$/ }, () => ({
      path: 'symgrad-inline-css',
      namespace: 'inline-css'
    }));
    build.onLoad({ filter: /.*/, namespace: 'inline-css' }, () => ({
      contents: `export default ${JSON.stringify(css)};`,
      loader: 'js'
    }));
  }
};

fs.mkdirSync(path.dirname(outFile), { recursive: true });
const result = await esbuild.build({
  entryPoints: [path.join(root, 'src', 'widget.ts')],
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: ['es2020'],
  minify: !dev,
  sourcemap: false,
  legalComments: 'eof',
  outfile: outFile,
  plugins: [inlineCss],
  metafile: true,
  logLevel: 'warning'
});
const bytes = fs.statSync(outFile).size;
console.log(
  `${path.relative(path.resolve(root, '..'), outFile)}: ${(bytes / 1024).toFixed(0)} KiB`
);
void result;
