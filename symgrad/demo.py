"""The main job (``make demo``): run the showcase notebook headlessly, as a user would.

Executes ``notebooks/00_showcase.ipynb`` with nbclient on a real kernel, prints the
verification summary of every ``%%symgrad`` cell as a table, writes the executed
notebook and an HTML export under ``demo-output/``, and exits non-zero if any
verification failed (or the notebook raised).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

GRAPH_MIME = "application/vnd.symgrad.graph+json"
ROOT = pathlib.Path(__file__).resolve().parents[1]
SHOWCASE = ROOT / "notebooks" / "00_showcase.ipynb"


def summarize(nb) -> list[dict]:
    """One row per ``%%symgrad`` cell: its roots, the verifier's mode, leaves and verdict."""
    rows = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.lstrip().startswith("%%symgrad"):
            continue
        graphs = [o["data"][GRAPH_MIME] for o in cell.get("outputs", [])
                  if GRAPH_MIME in o.get("data", {})]
        if not graphs:
            rows.append({"cell": index, "roots": "?", "mode": "-", "leaves": "-",
                         "ok": False, "detail": "no graph output"})
            continue
        g = graphs[-1]
        agreement = g.get("agreement") or {}
        leaf_rows = agreement.get("rows") or []
        bad = agreement.get("first_bad_node")
        rows.append({
            "cell": index,
            "roots": ", ".join(g.get("root_names") or []) or "-",
            "mode": agreement.get("mode", "not verified"),
            "leaves": ", ".join(f"{r.get('leaf')}:{r.get('status', '?')}" for r in leaf_rows),
            "ok": bool(agreement.get("ok")),
            "detail": f"first bad node {bad}" if bad else "",
        })
    return rows


def print_table(rows: list[dict]) -> None:
    headers = ["cell", "roots", "mode", "leaves", "verdict"]
    body = [[str(r["cell"]), r["roots"], r["mode"], r["leaves"],
             ("agrees" if r["ok"] else "DISAGREES") + (f" ({r['detail']})" if r["detail"] else "")]
            for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for b in body:
        print("  ".join(c.ljust(w) for c, w in zip(b, widths)))


def run(notebook: pathlib.Path = SHOWCASE, out_dir: pathlib.Path = ROOT / "demo-output",
        timeout: int = 300) -> int:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(notebook, as_version=4)
    print(f"executing {notebook.relative_to(ROOT) if notebook.is_relative_to(ROOT) else notebook}"
          " on a fresh kernel ...", flush=True)
    start = time.perf_counter()
    failed_cell = None
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(notebook.parent)}}).execute()
    except CellExecutionError as exc:
        failed_cell = str(exc).strip().splitlines()[-1]
    print(f"done in {time.perf_counter() - start:.1f} s\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / notebook.name
    nbformat.write(nb, executed)
    html_path = out_dir / (notebook.stem + ".html")
    try:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_notebook_node(nb)
        html_path.write_text(body)
    except ImportError:
        html_path = None
    rows = summarize(nb)
    print("verification of every %%symgrad cell:")
    print_table(rows)
    print(f"\nwrote {executed} ({executed.stat().st_size / 1000:.0f} KB)"
          + (f" and {html_path}" if html_path else ""))
    if failed_cell:
        print(f"\nthe notebook raised: {failed_cell}", file=sys.stderr)
        return 1
    if not rows or not all(r["ok"] for r in rows):
        print("\nsome verification failed", file=sys.stderr)
        return 1
    print(f"\nall {len(rows)} verified graphs agree with SymPy")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m symgrad.demo", description=__doc__)
    parser.add_argument("notebook", nargs="?", type=pathlib.Path, default=SHOWCASE)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "demo-output")
    args = parser.parse_args(argv)
    return run(args.notebook, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
