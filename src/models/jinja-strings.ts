// Python's str methods for chat templates where @huggingface/jinja's differ or are missing. Its strip / lstrip /
// rstrip ignore their argument and always strip whitespace, where Python (transformers' Jinja) strips the characters
// given: Qwen3's template reads `content.lstrip('\n')` and `reasoning_content.strip('\n')`, and with the library's a
// reply opening with spaces or a tab lost them. find, count, format, join, rsplit, splitlines, removeprefix /
// removesuffix and isdigit / isalpha / isspace / isupper / islower it lacks. The library exports neither its
// string value nor its function value, so both are reached through a value that an Environment converts, and the
// builtins are set on each string's builtins map.
import { Environment } from "@huggingface/jinja";
import { strFormat } from "./jinja-format.js";
import type { PyValue } from "./jinja-repr.js";

type Builtins = Map<string, unknown>;
interface StringValueLike {
  value: string;
  readonly builtins: Builtins;
}
type Fn = (args: PyValue[]) => unknown;

/** Python's whitespace for strip() without an argument (str.isspace). */
const PY_SPACE = "\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000";

/** `text` without the leading (`left`) and trailing (`right`) characters that are in `chars`. */
export function pyStrip(text: string, chars: string | null, left: boolean, right: boolean): string {
  const set = new Set(chars ?? PY_SPACE);
  const cps = [...text];
  let start = 0;
  let end = cps.length;
  while (left && start < end && set.has(cps[start]!)) start++;
  while (right && end > start && set.has(cps[end - 1]!)) end--;
  return cps.slice(start, end).join("");
}

/** Python's slice bounds text[start:end] over `length` code points (None: the whole). */
function bounds(length: number, start: unknown, end: unknown): [number, number] {
  const at = (i: unknown, whole: number) => (typeof i !== "number" ? whole : i < 0 ? Math.max(0, length + i) : Math.min(i, length));
  return [at(start, 0), at(end, length)];
}

/** Python's str.find: the code-point index of `sub` in text[start:end], or -1. */
export function pyFind(text: string, sub: string, start?: unknown, end?: unknown): number {
  const cps = [...text];
  const [from, to] = bounds(cps.length, start, end);
  if (from > to) return -1;
  const window = cps.slice(from, to).join("");
  const i = window.indexOf(sub);
  return i < 0 ? -1 : from + [...window.slice(0, i)].length;
}

/** Python's str.count: how many times `sub` occurs, without overlaps, in text[start:end]. */
export function pyCount(text: string, sub: string, start?: unknown, end?: unknown): number {
  const cps = [...text];
  const [from, to] = bounds(cps.length, start, end);
  if (from > to) return 0;
  return sub === "" ? to - from + 1 : cps.slice(from, to).join("").split(sub).length - 1;
}

/** Python's str.rsplit: split at `sep` (None: runs of whitespace) from the right, at most `maxsplit` times (-1: all). */
export function pyRsplit(text: string, sep: string | null, maxsplit: number): string[] {
  if (sep === "") throw new Error("empty separator");
  const parts: string[] = [];
  let rest = sep === null ? pyStrip(text, null, false, true) : text;
  while (maxsplit < 0 || parts.length < maxsplit) {
    if (sep === null) {
      if (rest === "") break;
      const cps = [...rest];
      let at = cps.length;
      while (at > 0 && !PY_SPACE.includes(cps[at - 1]!)) at--;
      parts.unshift(cps.slice(at).join(""));
      rest = pyStrip(cps.slice(0, at).join(""), null, false, true);
    } else {
      const at = rest.lastIndexOf(sep);
      if (at === -1) break;
      parts.unshift(rest.slice(at + sep.length));
      rest = rest.slice(0, at);
    }
  }
  return sep === null && rest === "" ? parts : [rest, ...parts];
}

/** Python's str.splitlines: lines split at \n, \r, \r\n and the other Unicode line boundaries, without a last empty one. */
export function pySplitlines(text: string, keepends: boolean): string[] {
  const lines: string[] = [];
  const boundary = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/g;
  let start = 0;
  for (let m = boundary.exec(text); m !== null; m = boundary.exec(text)) {
    lines.push(text.slice(start, keepends ? m.index + m[0].length : m.index));
    start = m.index + m[0].length;
  }
  if (start < text.length) lines.push(text.slice(start));
  return lines;
}

/** Python's str.isupper / islower: some cased character, and every cased one in that case. */
const isCase = (text: string, upper: boolean) => text !== (upper ? text.toLowerCase() : text.toUpperCase()) && text === (upper ? text.toUpperCase() : text.toLowerCase());

let patched = false;

/** Gives the Jinja runtime's strings Python's strip, find, format, join, rsplit, ... (above), once per process. */
export function usePythonStrMethods(): void {
  if (patched) return;
  patched = true;
  const env = new Environment();
  env.set("s", "");
  env.set("i", 0);
  env.set("b", true);
  env.set("l", []);
  const sample = env.lookupVariable("s") as unknown as StringValueLike;
  const StringValue = sample.constructor as new (value: string) => unknown;
  const IntegerValue = env.lookupVariable("i").constructor as new (value: number) => unknown;
  const BooleanValue = env.lookupVariable("b").constructor as new (value: boolean) => unknown;
  const ArrayValue = env.lookupVariable("l").constructor as new (value: unknown[]) => unknown;
  const strings = (parts: string[]) => new ArrayValue(parts.map((p) => new StringValue(p)));
  const FunctionValue = (sample.builtins.get("upper") as object).constructor as new (fn: Fn) => unknown;
  const proto = Object.getPrototypeOf(sample) as object;
  const original = Object.getOwnPropertyDescriptor(proto, "builtins")?.get;
  if (original === undefined) throw new Error("[chat_template] @huggingface/jinja's strings have no builtins getter");
  const withStrip = new WeakSet<Builtins>();
  Object.defineProperty(proto, "builtins", {
    configurable: true,
    get(this: StringValueLike): Builtins {
      const map = original.call(this) as Builtins;
      if (withStrip.has(map)) return map;
      const strip = (left: boolean, right: boolean) =>
        new FunctionValue((args) => {
          const chars = args[0]?.value;
          if (chars !== undefined && chars !== null && typeof chars !== "string") throw new Error("strip arg must be None or str");
          return new StringValue(pyStrip(this.value, chars ?? null, left, right));
        });
      map.set("strip", strip(true, true));
      map.set("lstrip", strip(true, false));
      map.set("rstrip", strip(false, true));
      const search = (fn: typeof pyFind, name: string) =>
        new FunctionValue(([sub, start, end]) => {
          if (sub?.type !== "StringValue") throw new Error(`${name}() argument must be str`);
          return new IntegerValue(fn(this.value, sub.value as string, start?.value, end?.value));
        });
      map.set("find", search(pyFind, "find"));
      map.set("count", search(pyCount, "count"));
      map.set(
        "format",
        new FunctionValue((args) => {
          const kwargs = args.at(-1)?.type === "KeywordArgumentsValue" ? (args.pop()!.value as Map<string, PyValue>) : new Map<string, PyValue>();
          return new StringValue(strFormat(this.value, args, kwargs));
        }),
      );
      const text = this.value;
      const test = (name: string, pass: (t: string) => boolean) => map.set(name, new FunctionValue(() => new BooleanValue(pass(text))));
      test("isdigit", (t) => /^[\p{Nd}\u00b2\u00b3\u00b9\u2070\u2074-\u2079\u2080-\u2089]+$/u.test(t));
      test("isalpha", (t) => /^\p{L}+$/u.test(t));
      test("isspace", (t) => t !== "" && [...t].every((c) => PY_SPACE.includes(c)));
      test("isupper", (t) => isCase(t, true));
      test("islower", (t) => isCase(t, false));
      const affix = (name: string, cut: (s: string) => string) =>
        map.set(
          name,
          new FunctionValue(([s]) => {
            if (s?.type !== "StringValue") throw new Error(`${name}() argument must be str`);
            return new StringValue(cut(s.value as string));
          }),
        );
      affix("removeprefix", (p) => (text.startsWith(p) ? text.slice(p.length) : text));
      affix("removesuffix", (p) => (p !== "" && text.endsWith(p) ? text.slice(0, -p.length) : text));
      map.set(
        "join",
        new FunctionValue(([seq]) => {
          const parts = seq?.type === "StringValue" ? [...(seq.value as string)] : (seq?.value as PyValue[] | undefined);
          if (seq === undefined || !Array.isArray(parts)) throw new Error("can only join an iterable");
          return new StringValue(
            parts
              .map((p, i) => {
                if (typeof p === "string") return p;
                if (p.type !== "StringValue") throw new Error(`sequence item ${i}: expected str instance, ${p.type.replace(/Value$/, "")} found`);
                return p.value as string;
              })
              .join(text),
          );
        }),
      );
      const options = (args: PyValue[], names: string[]) => {
        const kwargs = args.at(-1)?.type === "KeywordArgumentsValue" ? (args.pop()!.value as Map<string, PyValue>) : new Map<string, PyValue>();
        return names.map((name, i) => (args[i] ?? kwargs.get(name))?.value);
      };
      map.set(
        "rsplit",
        new FunctionValue((args) => {
          const [sep, maxsplit] = options(args, ["sep", "maxsplit"]);
          if (sep !== undefined && sep !== null && typeof sep !== "string") throw new Error("must be str or None");
          return strings(pyRsplit(text, (sep as string | null | undefined) ?? null, typeof maxsplit === "number" ? maxsplit : -1));
        }),
      );
      map.set("splitlines", new FunctionValue((args) => strings(pySplitlines(text, options(args, ["keepends"])[0] === true))));
      withStrip.add(map);
      return map;
    },
  });
}
