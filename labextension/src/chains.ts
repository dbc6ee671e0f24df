// Collapsing long chains: loops (`x = x * w + b`) build runs of simple ops that make a
// 500-node graph unreadable; collapsed, each run is one box. The same rule as layout.py's
// find_chains, so the chain boxes of a shipped layout are the ones found here.
import { CheckStatus, IGraphNode, IGraphPayload } from './types';

/** Above this many nodes, linear runs of ops are collapsed into one box by default. */
export const AUTO_COLLAPSE_NODES = 150;
/** Shortest run of ops that is collapsed. */
export const MIN_RUN = 6;

export interface IGroup {
  id: string;
  members: IGraphNode[];
  label: string;
  sub: string;
  status: CheckStatus;
}

const STATUS_RANK: Record<CheckStatus, number> = {
  fail: 4,
  error: 3,
  pass: 2,
  skipped: 1,
  none: 0
};

function summarizeRun(members: IGraphNode[]): string {
  const names = members.map(m => m.label);
  for (let p = 1; p <= Math.min(4, Math.floor(names.length / 2)); p++) {
    if (names.every((n, i) => n === names[i % p])) {
      const reps = Math.floor(names.length / p);
      const rest = names.length - reps * p;
      const unit =
        p === 1 ? names[0] : '(' + names.slice(0, p).join(' → ') + ')';
      return `${unit} × ${reps}` + (rest ? ` + ${rest}` : '');
    }
  }
  return `${names[0]} → … → ${names[names.length - 1]}`;
}

/**
 * Find maximal runs of op nodes a → b → c … where each node's only op input is the next
 * one and each is consumed only by the previous one, and each is a simple node: one input
 * of its own. An input of its own is any op, and any leaf that no other op consumes (a
 * layer's weight); leaves shared by several ops (the `w` of `x = x * w + b`) and None do
 * not count. Such runs come from loops and are what makes a 500-node graph unreadable;
 * collapsed, they become one box with their shared leaves around it. A conv net's body
 * does not fold: a convolution, with its own weight and bias, stays in sight. The same
 * rule as find_chains in symgrad/jupyter/layout.py.
 */
export function findChains(g: IGraphPayload, keep: Set<string>): IGroup[] {
  const byId = new Map(g.nodes.map(n => [n.id, n] as const));
  const opChildren = new Map<string, Set<string>>();
  const parents = new Map<string, Set<string>>();
  const inputs = new Map<string, Set<string>>();
  const add = (m: Map<string, Set<string>>, k: string, v: string): void => {
    if (!m.has(k)) {
      m.set(k, new Set());
    }
    m.get(k)!.add(v);
  };
  for (const e of g.edges) {
    add(parents, e.to, e.from);
    add(inputs, e.from, e.to);
    if (byId.get(e.to)?.kind === 'op') {
      add(opChildren, e.from, e.to);
    }
  }
  const ownInputs = (id: string): number => {
    let count = 0;
    for (const i of inputs.get(id) ?? []) {
      const kind = byId.get(i)?.kind;
      if (
        kind === 'op' ||
        ((kind === 'leaf' || kind === 'accumulate') &&
          (parents.get(i)?.size ?? 0) < 2)
      ) {
        count++;
      }
    }
    return count;
  };
  const roots = new Set(g.roots);
  const breaker = (n: IGraphNode): boolean =>
    n.kind !== 'op' ||
    keep.has(n.id) ||
    roots.has(n.id) || // the root stays in sight
    n.first_bad === true ||
    n.check.status === 'fail' ||
    n.check.status === 'error' ||
    ownInputs(n.id) > 1; // a node with several inputs (a layer) is never folded
  // next(a) = b when the link a → b may be inside a run.
  const next = new Map<string, string>();
  const hasPrev = new Set<string>();
  for (const n of g.nodes) {
    if (breaker(n)) {
      continue;
    }
    const kids = opChildren.get(n.id);
    if (!kids || kids.size !== 1) {
      continue;
    }
    const b = kids.values().next().value as string;
    const bn = byId.get(b);
    const ps = parents.get(b);
    if (bn && !breaker(bn) && !roots.has(b) && ps && ps.size === 1) {
      next.set(n.id, b);
      hasPrev.add(b);
    }
  }
  const groups: IGroup[] = [];
  for (const n of g.nodes) {
    if (!next.has(n.id) || hasPrev.has(n.id)) {
      continue;
    }
    const members: IGraphNode[] = [n];
    let cur = n.id;
    const seen = new Set([cur]);
    while (next.has(cur)) {
      cur = next.get(cur)!;
      if (seen.has(cur)) {
        break;
      }
      seen.add(cur);
      members.push(byId.get(cur)!);
    }
    if (members.length >= MIN_RUN) {
      let status: CheckStatus = 'none';
      for (const m of members) {
        if (STATUS_RANK[m.check.status] > STATUS_RANK[status]) {
          status = m.check.status;
        }
      }
      groups.push({
        id: 'chain:' + n.id,
        members,
        label: summarizeRun(members),
        sub: `${members.length} nodes · click to expand`,
        status
      });
    }
  }
  return groups;
}
