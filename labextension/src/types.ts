// Shapes of the payloads, mirroring symgrad/jupyter/graph.schema.json (symgrad.graph/1).
// The schema is authoritative: payloads are validated against it before these types are
// trusted (see validate.ts).

export type Shape = number[] | null;
export type CheckStatus = 'pass' | 'fail' | 'skipped' | 'error' | 'none';
export type NodeKind = 'op' | 'accumulate' | 'leaf' | 'none';

export interface ICheck {
  status: CheckStatus;
  max_abs_err?: number | null;
  max_rel_err?: number | null;
  message?: string | null;
  sampled?: number | null;
}

export interface ISaved {
  name: string;
  attr?: string;
  kind: 'tensor' | 'scalar' | 'meta' | 'value' | 'none' | 'freed';
  shape?: Shape;
  dtype?: string | null;
  preview?: string;
  same_object_as?: string | null;
  is_output?: boolean;
}

export interface IGraphNode {
  id: string;
  kind: NodeKind;
  label: string;
  name: string;
  shape: Shape;
  dtype: string | null;
  variable?: string | null;
  saved: ISaved[];
  formula?: string | null;
  derivative?: string | null;
  check: ICheck;
  first_bad?: boolean;
  order?: number;
  /** Path of the innermost nn.Module call that produced the node ('' for none). */
  module?: string;
}

export interface IGraphEdge {
  from: string;
  to: string;
  input: number;
  output_nr?: number;
}

export interface ILeaf {
  id: string;
  name: string;
  shape: Shape;
  dtype: string | null;
  preview?: string;
  grad_preview?: string | null;
}

export interface IAgreementRow {
  leaf: string;
  node?: string | null;
  engine?: string | null;
  symbolic?: string | null;
  symbolic_latex?: string | null;
  finite_diff?: string | null;
  max_abs_err?: number | null;
  max_rel_err?: number | null;
  /** Elements whose exact gradient is 0 (no relative error there). */
  exact_zeros?: number | null;
  fd_max_abs_err?: number | null;
  status: CheckStatus;
}

export interface IAgreement {
  ok: boolean | null;
  mode?: string | null;
  rtol?: number | null;
  atol?: number | null;
  first_bad_node?: string | null;
  message?: string | null;
  verdict?: string | null; // ok null: why neither; ok a bool: at which values it holds
  rows: IAgreementRow[];
}

export interface IGraphPayload {
  schema: 'symgrad.graph/1';
  source?: 'symgrad' | 'torch';
  nodes: IGraphNode[];
  edges: IGraphEdge[];
  roots: string[];
  root_names?: string[];
  leaves: ILeaf[];
  agreement?: IAgreement | null;
  truncated?: number;
  formulas_omitted?: number;
  layout?: IGraphLayout;
  /** The nn.Module calls that produced the nodes (module-aware drawing). */
  modules?: IGraphModule[];
  /** Runs of consecutive sibling modules of equal structure, drawn as one box. */
  folds?: IGraphFold[];
  /** Module paths drawn collapsed at first (a big model: its top-level modules). */
  collapsed?: string[];
  /** The module path this payload was cut to (only its nodes are present). */
  focus?: string;
}

export type ModuleVerdict = 'ok' | 'bad' | 'unchecked';

/** One nn.Module of the model whose calls produced nodes of the graph. */
export interface IGraphModule {
  path: string;
  /** Class name. */
  type: string;
  parent: string | null;
  depth: number;
  /** Ids of the nodes produced inside it, its submodules' included. */
  nodes: string[];
  verdict: ModuleVerdict;
  first_bad?: string | null;
  /** Equal for modules of the same structure. */
  signature?: string;
}

/** Consecutive sibling modules of one signature: 'Block × N'. */
export interface IGraphFold {
  label: string;
  parent: string | null;
  members: string[];
}

/** Where the first drawing's boxes go (symgrad/jupyter/layout.py payload_layout). */
export interface IGraphLayout {
  width: number;
  height: number;
  /** Drawn node id (a chain: 'chain:' + first member) -> 'x y width height'. */
  nodes: Record<string, string>;
  /** [from, to, 'x1 y1 x2 y2 ...']: bend points of the edges that have some. */
  edges?: string[][];
}
