// Provided by scripts/build-widget.mjs: the widget's CSS, fonts inlined.
declare module 'symgrad-inline-css' {
  const css: string;
  export default css;
}
