// Provided by scripts/build-test-bundle.mjs: the CSS, fonts inlined.
declare module 'symgrad-inline-css' {
  const css: string;
  export default css;
}
