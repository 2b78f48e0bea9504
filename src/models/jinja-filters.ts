// Jinja2's filters where @huggingface/jinja's are missing or differ, as transformers renders chat templates: tojson
// as json.dumps (1.0 stays 1.0, tuples are arrays), map('filter'), select / reject with a test, sum, max, min, round,
// list (of a tuple, string or dict too), and first / last of a string. Each takes the evaluated positional and keyword arguments; jinja-python.ts
// routes these names here and makes the values through a FilterContext (the library exports no value classes).
import { entries, items, pyJson, type PyValue } from "./jinja-repr.js";

/** The runtime's value constructors and the Jinja operations a filter calls back into. */
export interface FilterContext {
  str(s: string): PyValue;
  int(n: number): PyValue;
  float(x: number): PyValue;
  list(xs: PyValue[]): PyValue;
  undefined(): PyValue;
  truthy(v: PyValue): boolean;
  /** `value | name(*args, **kwargs)`. */
  filter(value: PyValue, name: string, args: PyValue[], kwargs: Map<string, PyValue>): PyValue;
  /** `value is name(*args)`. */
  test(value: PyValue, name: string, args: PyValue[]): boolean;
}
/** A filter on its evaluated arguments; undefined leaves the call to the library's filter of that name. */
type Filter = (operand: PyValue, args: PyValue[], kwargs: Map<string, PyValue>, ctx: FilterContext) => PyValue | undefined;

/** The argument at `index`, else keyword `name`, else undefined. */
const arg = (args: PyValue[], kwargs: Map<string, PyValue>, index: number, name: string): PyValue | undefined => args[index] ?? kwargs.get(name);
const isNumber = (v: PyValue) => v.type === "IntegerValue" || v.type === "FloatValue" || v.type === "BooleanValue";

/** What iterating a value gives in Python: a list's items, a string's characters, a dict's keys. */
function iterate(v: PyValue, ctx: FilterContext, filter: string): PyValue[] {
  if (v.type === "ArrayValue" || v.type === "TupleValue") return items(v);
  if (v.type === "StringValue") return [...(v.value as string)].map((c) => ctx.str(c));
  if (v.type === "ObjectValue") return entries(v).map(([k]) => ctx.str(k));
  throw new Error(`${filter}: '${v.type.replace(/Value$/, "")}' object is not iterable`);
}

/** Jinja2's attribute getter: "a.b.0" looks up keys and list indices in turn. */
function attribute(item: PyValue, path: string, ctx: FilterContext): PyValue {
  let v = item;
  for (const part of path.split(".")) {
    if (v.type === "ObjectValue" || v.type === "NamespaceValue") v = (v.value as Map<string, PyValue>).get(part) ?? ctx.undefined();
    else if ((v.type === "ArrayValue" || v.type === "TupleValue") && /^\d+$/.test(part)) v = items(v)[Number(part)] ?? ctx.undefined();
    else return ctx.undefined();
  }
  return v;
}

/** Python's ordering of two numbers or two strings (`<` on other types raises). */
function compare(a: PyValue, b: PyValue): number {
  if (isNumber(a) && isNumber(b)) return Number(a.value) - Number(b.value);
  if (a.type === "StringValue" && b.type === "StringValue") return a.value === b.value ? 0 : (a.value as string) < (b.value as string) ? -1 : 1;
  throw new Error(`'<' not supported between ${a.type} and ${b.type}`);
}

/** Python's round(x, n): to the nearest, ties to even on the exact binary value (round(2.5) == 2, round(2.675, 2) == 2.67). */
export function pyRound(x: number, n: number): number {
  if (!Number.isFinite(x)) return x;
  if (n < 0) return pyRound(x / 10 ** -n, 0) * 10 ** -n;
  const digits = Math.min(n, 100);
  const exact = x.toFixed(Math.min(digits + 60, 100)); // the binary value's decimal digits
  const cut = exact.indexOf(".") + 1 + digits;
  const nearest = Number(x.toFixed(digits)); // ties go away from zero here
  if (!/^50*$/.test(exact.slice(cut))) return nearest;
  const truncated = exact.slice(0, digits === 0 ? cut - 1 : cut); // toward zero
  return Number(truncated.at(-1)) % 2 === 0 ? Number(truncated) : nearest;
}

/** max / min: the first largest (smallest) item, strings compared case-insensitively unless case_sensitive. */
const extreme =
  (sign: 1 | -1): Filter =>
  (operand, args, kwargs, ctx) => {
    const caseSensitive = arg(args, kwargs, 0, "case_sensitive");
    const attr = arg(args, kwargs, 1, "attribute");
    const key = (v: PyValue) => {
      const k = attr === undefined || attr.type === "NullValue" ? v : attribute(v, String(attr.value), ctx);
      return k.type === "StringValue" && !(caseSensitive !== undefined && ctx.truthy(caseSensitive)) ? ctx.str((k.value as string).toLowerCase()) : k;
    };
    let best: PyValue | undefined;
    for (const v of iterate(operand, ctx, sign > 0 ? "max" : "min")) if (best === undefined || sign * compare(key(v), key(best)) > 0) best = v;
    return best ?? ctx.undefined();
  };

/** The first / last character of a string (undefined when empty); other operands are the library's. */
const end =
  (pick: (cs: string[]) => string | undefined): Filter =>
  (operand, _args, _kwargs, ctx) => {
    const ch = pick([...(operand.value as string)]);
    return ch === undefined ? ctx.undefined() : ctx.str(ch);
  };

/** Filters that replace the library's for every operand. */
export const PYTHON_FILTERS = new Map<string, Filter>(Object.entries({
  tojson(operand: PyValue, args: PyValue[], kwargs: Map<string, PyValue>, ctx: FilterContext) {
    const ensureAscii = arg(args, kwargs, 0, "ensure_ascii");
    const indent = arg(args, kwargs, 1, "indent");
    const separators = arg(args, kwargs, 2, "separators");
    const sortKeys = arg(args, kwargs, 3, "sort_keys");
    const seps = separators === undefined || separators.type === "NullValue" ? null : items(separators).map((s) => String(s.value));
    if (seps !== null && seps.length !== 2) throw new Error("tojson: separators must be a pair of strings");
    return ctx.str(
      pyJson(operand, {
        indent: indent === undefined || indent.type === "NullValue" ? null : (indent.value as number | string),
        ensureAscii: ensureAscii?.value === true,
        sortKeys: sortKeys?.value === true,
        separators: seps as [string, string] | null,
      }),
    );
  },
  sum(operand: PyValue, args: PyValue[], kwargs: Map<string, PyValue>, ctx: FilterContext) {
    const attr = arg(args, kwargs, 0, "attribute");
    let total = arg(args, kwargs, 1, "start") ?? ctx.int(0);
    for (const item of iterate(operand, ctx, "sum")) {
      const v = attr === undefined || attr.type === "NullValue" ? item : attribute(item, String(attr.value), ctx);
      if ((total.type === "ArrayValue" || total.type === "TupleValue") && v.type === total.type) total = ctx.list([...items(total), ...items(v)]);
      else if (isNumber(total) && isNumber(v)) {
        const x = Number(total.value) + Number(v.value);
        total = total.type === "FloatValue" || v.type === "FloatValue" ? ctx.float(x) : ctx.int(x);
      } else throw new Error(`sum: unsupported operand types for +: ${total.type} and ${v.type}`);
    }
    return total;
  },
  max: extreme(1),
  min: extreme(-1),
  round(operand: PyValue, args: PyValue[], kwargs: Map<string, PyValue>, ctx: FilterContext) {
    const precision = Number(arg(args, kwargs, 0, "precision")?.value ?? 0);
    const method = String(arg(args, kwargs, 1, "method")?.value ?? "common");
    if (!isNumber(operand)) throw new Error(`round: must be real number, not ${operand.type}`);
    const x = Number(operand.value);
    if (method === "common") return operand.type === "FloatValue" ? ctx.float(pyRound(x, precision)) : ctx.int(pyRound(x, precision));
    if (method !== "ceil" && method !== "floor") throw new Error("round: method must be common, ceil or floor");
    return ctx.float(Math[method](x * 10 ** precision) / 10 ** precision);
  },
  map(operand: PyValue, args: PyValue[], kwargs: Map<string, PyValue>, ctx: FilterContext) {
    const [name, ...rest] = args;
    if (name?.type !== "StringValue") return undefined; // map(attribute=...): the library's
    return ctx.list(iterate(operand, ctx, "map").map((v) => ctx.filter(v, name.value as string, rest, kwargs)));
  },
  list: (operand: PyValue, _args: unknown, _kwargs: unknown, ctx: FilterContext) => ctx.list(iterate(operand, ctx, "list")),
  select: (operand: PyValue, args: PyValue[], _kwargs: unknown, ctx: FilterContext) => choose(operand, args, ctx, true),
  reject: (operand: PyValue, args: PyValue[], _kwargs: unknown, ctx: FilterContext) => choose(operand, args, ctx, false),
} satisfies Record<string, Filter>));

/** select / reject: the items that pass (fail) the named test with the rest of the arguments, or are truthy (falsy). */
function choose(operand: PyValue, args: PyValue[], ctx: FilterContext, keep: boolean): PyValue {
  const [name, ...rest] = args;
  const pass = (v: PyValue) => (name === undefined ? ctx.truthy(v) : ctx.test(v, String(name.value), rest));
  return ctx.list(iterate(operand, ctx, keep ? "select" : "reject").filter((v) => pass(v) === keep));
}

/** Filters that differ from the library's for strings only (a list's first / last are the library's). */
export const STRING_FILTERS = new Map<string, Filter>([
  ["first", end((cs) => cs[0])],
  ["last", end((cs) => cs.at(-1))],
]);
