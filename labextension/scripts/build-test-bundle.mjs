// Bundle the Inspector's view (src/standalone.ts: the drawing module, the control bar and
// the CSS, KaTeX's included, with woff2 fonts inlined as data URLs) as one ES module, for
// the browser tests that drive it without JupyterLab (tests/browser/test_renderer.py).
// Not part of the build: JupyterLab and Notebook 7 get the view from the labextension.
//   node scripts/build-test-bundle.mjs [--out FILE] [--dev]
// The default FILE is lib/test-bundle/inspector.js.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '..');
const args = process.argv.slice(2);
const outArg = args.indexOf('--out');
const outFile =
  outArg >= 0
    ? path.resolve(args[outArg + 1])
    : path.join(root, 'lib', 'test-bundle', 'inspector.js');
const dev = args.includes('--dev');

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
await esbuild.build({
  entryPoints: [path.join(root, 'src', 'standalone.ts')],
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: ['es2020'],
  minify: !dev,
  sourcemap: false,
  legalComments: 'eof',
  outfile: outFile,
  plugins: [inlineCss],
  logLevel: 'warning'
});
const bytes = fs.statSync(outFile).size;
console.log(`${outFile}: ${(bytes / 1024).toFixed(0)} KiB`);
