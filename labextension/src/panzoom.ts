// Pan and zoom of the graph drawing: drag to pan, Ctrl/Cmd+wheel (or any wheel once the
// canvas has been clicked) to zoom, +/- keys, Escape clears the selection; the drawing is
// fitted to the width on first draw and on resize until the user moves it.
import { IBounds } from './layout';

/** Labels are at least this tall (CSS px) at "Fit"; zooming out by hand may go lower. */
export const MIN_LABEL_PX = 10;

export type Listen = <K extends keyof HTMLElementEventMap>(
  target: HTMLElement | SVGElement | Window,
  type: K,
  fn: (e: HTMLElementEventMap[K]) => void,
  options?: AddEventListenerOptions
) => void;

/** What pan and zoom act on, given by the view. */
export interface IPanZoomHost {
  element: HTMLElement;
  canvas: HTMLElement;
  viewport: SVGGElement;
  /** Tallest the drawing area grows, in px. */
  maxHeight: number;
  /** Adds a listener that the view removes on teardown. */
  listen: Listen;
  bounds(): IBounds;
  /** Smallest scale "Fit" uses: the one where node labels are MIN_LABEL_PX tall. */
  minScale(): number;
  /** x of the node kept in view when the drawing is too wide to fit (the root). */
  anchorX(): number | null;
  onEscape(): void;
}

export class PanZoom {
  private t = { k: 1, x: 0, y: 0 };
  /** The user panned or zoomed: redraws and resizes keep the view where it is. */
  userMoved = false;
  private active = false;
  private resizeObserver: ResizeObserver | null = null;

  constructor(private host: IPanZoomHost) {
    this.install();
  }

  dispose(): void {
    this.resizeObserver?.disconnect();
    this.resizeObserver = null;
  }

  applyTransform(): void {
    const { k, x, y } = this.t;
    this.host.viewport.setAttribute(
      'transform',
      `translate(${x.toFixed(1)},${y.toFixed(1)}) scale(${k})`
    );
    this.host.element.dataset.zoom = k.toFixed(3);
  }

  canvasWidth(): number {
    return this.host.canvas.clientWidth || this.host.element.clientWidth || 720;
  }

  /** Fit the graph to the width, not below the scale of readable labels (a graph too
   * big for that is panned instead); the root stays in view. */
  fit(force: boolean): void {
    if (this.userMoved && !force) {
      this.applyTransform();
      return;
    }
    const maxH = this.host.maxHeight;
    const cw = this.canvasWidth();
    const { width, height } = this.host.bounds();
    let k = Math.min(cw / width, maxH / height, 1.25);
    // Never below readable labels: a bigger graph is panned (drag) instead.
    k = Math.max(k, Math.min(this.host.minScale(), 1.25));
    const ch = Math.max(Math.min(height * k, maxH), 90);
    this.host.canvas.style.height = `${Math.ceil(ch)}px`;
    const x = width * k <= cw ? (cw - width * k) / 2 : 0;
    this.t = { k, x, y: height * k <= ch ? (ch - height * k) / 2 : 0 };
    const anchor = this.host.anchorX();
    if (width * k > cw && anchor !== null) {
      // Too wide to fit: centre the first root.
      this.t.x = cw / 2 - anchor * k;
    }
    this.applyTransform();
  }

  /** Pan (scale kept) so that a rect of the drawing is in view, its top left first:
   * what the user just opened. */
  show(r: { x: number; y: number; width: number; height: number }): void {
    const { k } = this.t;
    const cw = this.canvasWidth();
    const ch = this.host.canvas.clientHeight || this.host.maxHeight;
    const left = r.x * k + this.t.x;
    const top = r.y * k + this.t.y;
    if (left < 0 || left + r.width * k > cw) {
      this.t.x =
        r.width * k <= cw ? (cw - r.width * k) / 2 - r.x * k : 8 - r.x * k;
    }
    if (top < 0 || top + r.height * k > ch) {
      this.t.y = 8 - r.y * k;
    }
    this.applyTransform();
  }

  zoomBy(f: number, cx?: number, cy?: number): void {
    const k = Math.min(Math.max(this.t.k * f, 0.05), 4);
    const px = cx ?? this.canvasWidth() / 2;
    const py = cy ?? this.host.canvas.clientHeight / 2;
    this.t = {
      k,
      x: px - ((px - this.t.x) * k) / this.t.k,
      y: py - ((py - this.t.y) * k) / this.t.k
    };
    this.userMoved = true;
    this.applyTransform();
  }

  private install(): void {
    let drag: {
      x: number;
      y: number;
      tx: number;
      ty: number;
      id: number;
    } | null = null;
    this.host.listen(
      this.host.canvas,
      'wheel',
      e => {
        if (!(e.ctrlKey || e.metaKey || this.active)) {
          return;
        }
        e.preventDefault();
        const r = this.host.canvas.getBoundingClientRect();
        this.zoomBy(
          Math.exp(-e.deltaY * 0.0015),
          e.clientX - r.left,
          e.clientY - r.top
        );
      },
      { passive: false }
    );
    this.host.listen(this.host.canvas, 'pointerdown', e => {
      this.active = true;
      if ((e.target as Element).closest?.('.sg-node') || e.button !== 0) {
        return;
      }
      drag = {
        x: e.clientX,
        y: e.clientY,
        tx: this.t.x,
        ty: this.t.y,
        id: e.pointerId
      };
      this.host.canvas.classList.add('sg-dragging');
    });
    this.host.listen(this.host.canvas, 'pointermove', e => {
      if (!drag || e.pointerId !== drag.id) {
        return;
      }
      const dx = e.clientX - drag.x;
      const dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) {
        if (!this.host.canvas.hasPointerCapture(e.pointerId)) {
          this.host.canvas.setPointerCapture(e.pointerId);
        }
        this.userMoved = true;
        this.t.x = drag.tx + dx;
        this.t.y = drag.ty + dy;
        this.applyTransform();
      }
    });
    const end = (e: PointerEvent): void => {
      if (drag && e.pointerId === drag.id) {
        drag = null;
        this.host.canvas.classList.remove('sg-dragging');
      }
    };
    this.host.listen(this.host.canvas, 'pointerup', end);
    this.host.listen(this.host.canvas, 'pointercancel', end);
    this.host.listen(this.host.canvas, 'blur', () => {
      this.active = false;
    });
    this.host.listen(this.host.canvas, 'keydown', e => {
      if (e.key === '+' || e.key === '=') {
        this.zoomBy(1.25);
      } else if (e.key === '-') {
        this.zoomBy(0.8);
      } else if (e.key === 'Escape') {
        this.host.onEscape();
      } else {
        return;
      }
      e.preventDefault();
      e.stopPropagation(); // keep notebook shortcuts out of the drawing's keys
    });
    if (typeof ResizeObserver !== 'undefined') {
      let lastWidth = 0;
      this.resizeObserver = new ResizeObserver(() => {
        const w = this.host.canvas.clientWidth;
        if (w && Math.abs(w - lastWidth) > 8) {
          lastWidth = w;
          this.fit(false);
        }
      });
      this.resizeObserver.observe(this.host.canvas);
    }
  }

  // --------------------------------------------------------------------- the node panel
}
