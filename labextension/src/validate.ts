// Payload validation against the JSON schemas shipped in the Python package. The
// validators are generated at build time (scripts/build-validator.mjs) from the very
// files the Python tests use, so the renderer and the producer cannot drift apart
// silently: a payload that does not match is shown as a readable error, never drawn.
import * as graphSchema from './generated/graph-validator';
import * as reportSchema from './generated/report-validator';
import { IGraphPayload } from './types';

export const GRAPH_SCHEMA = 'symgrad.graph/1';

interface IAjvError {
  instancePath?: string;
  message?: string;
  keyword?: string;
  params?: Record<string, unknown>;
}

type ValidateFn = ((data: unknown) => boolean) & {
  errors?: IAjvError[] | null;
};

export type ValidationResult<T> =
  { ok: true; value: T } | { ok: false; errors: string[] };

function describe(err: IAjvError): string {
  const where = err.instancePath ? err.instancePath : '(top level)';
  let what = err.message ?? 'is invalid';
  const params = err.params ?? {};
  if (err.keyword === 'enum' && Array.isArray(params.allowedValues)) {
    what +=
      ': ' +
      (params.allowedValues as unknown[])
        .map(v => JSON.stringify(v))
        .join(', ');
  } else if (err.keyword === 'const' && 'allowedValue' in params) {
    what += ' ' + JSON.stringify(params.allowedValue);
  } else if (
    err.keyword === 'additionalProperties' &&
    params.additionalProperty
  ) {
    what += ` (${String(params.additionalProperty)})`;
  }
  return `${where}: ${what}`;
}

function run<T>(
  fn: ValidateFn | undefined,
  data: unknown,
  what: string
): ValidationResult<T> {
  if (data === null || typeof data !== 'object' || Array.isArray(data)) {
    return {
      ok: false,
      errors: [`expected a JSON object for the ${what}, got ${kind(data)}`]
    };
  }
  if (!fn) {
    return { ok: true, value: data as T };
  }
  if (fn(data)) {
    return { ok: true, value: data as T };
  }
  const seen = new Set<string>();
  const errors: string[] = [];
  for (const err of fn.errors ?? []) {
    const text = describe(err);
    if (!seen.has(text)) {
      seen.add(text);
      errors.push(text);
    }
  }
  return {
    ok: false,
    errors: errors.length ? errors : ['does not match the schema']
  };
}

function kind(data: unknown): string {
  if (data === null) {
    return 'null';
  }
  if (Array.isArray(data)) {
    return 'an array';
  }
  return typeof data === 'string' ? 'a string' : typeof data;
}

/** Validate a graph payload (application/vnd.symgrad.graph+json). */
export function validateGraph(data: unknown): ValidationResult<IGraphPayload> {
  if (data && typeof data === 'object' && !Array.isArray(data)) {
    const schema = (data as { schema?: unknown }).schema;
    if (typeof schema === 'string' && schema !== GRAPH_SCHEMA) {
      return {
        ok: false,
        errors: [
          `this output uses schema ${JSON.stringify(schema)}; this version of the ` +
            `symgrad extension draws ${JSON.stringify(GRAPH_SCHEMA)} (re-run the cell, or ` +
            'install matching symgrad versions in the kernel and in JupyterLab)'
        ]
      };
    }
  }
  const result = run<IGraphPayload>(
    graphSchema.validate as unknown as ValidateFn,
    data,
    'graph'
  );
  if (result.ok) {
    const extra = checkReferences(result.value);
    if (extra.length) {
      return { ok: false, errors: extra };
    }
  }
  return result;
}

/** Validate a report payload (application/vnd.symgrad.report+json). */
export function validateReport(
  data: unknown
): ValidationResult<Record<string, unknown>> {
  const fn = reportSchema.available
    ? (reportSchema.validate as unknown as ValidateFn)
    : undefined;
  return run<Record<string, unknown>>(fn, data, 'report');
}

/** Whether a report schema was found at build time. */
export const reportSchemaAvailable: boolean = reportSchema.available;

// What JSON schema cannot say: ids are unique and every edge and root points at a node.
function checkReferences(g: IGraphPayload): string[] {
  const ids = new Set<string>();
  const errors: string[] = [];
  g.nodes.forEach((n, i) => {
    if (ids.has(n.id)) {
      errors.push(`/nodes/${i}/id: duplicate node id ${JSON.stringify(n.id)}`);
    }
    ids.add(n.id);
  });
  g.edges.forEach((e, i) => {
    for (const end of ['from', 'to'] as const) {
      if (!ids.has(e[end])) {
        errors.push(
          `/edges/${i}/${end}: unknown node id ${JSON.stringify(e[end])}`
        );
      }
    }
  });
  g.roots.forEach((r, i) => {
    if (!ids.has(r)) {
      errors.push(`/roots/${i}: unknown node id ${JSON.stringify(r)}`);
    }
  });
  return errors.slice(0, 5);
}
