// Python's str.strip / lstrip / rstrip for chat templates: @huggingface/jinja's ignore their argument and always strip
// whitespace, where Python (transformers' Jinja) strips the characters given. Qwen3's template reads
// `content.lstrip('\n')` and `reasoning_content.strip('\n')`: with the library's, a reply opening with spaces or a
// tab lost them. The library exports neither its string value nor its function value, so both are reached through a
// value that an Environment converts, and the three builtins are replaced on each string's builtins map.
import { Environment } from "@huggingface/jinja";

type Builtins = Map<string, unknown>;
interface StringValueLike {
  value: string;
  readonly builtins: Builtins;
}
type Fn = (args: { value: unknown }[]) => unknown;

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

let patched = false;

/** Gives the Jinja runtime's strings Python's strip, lstrip and rstrip (once per process). */
export function usePythonStrip(): void {
  if (patched) return;
  patched = true;
  const env = new Environment();
  env.set("s", "");
  const sample = env.lookupVariable("s") as unknown as StringValueLike;
  const StringValue = sample.constructor as new (value: string) => unknown;
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
      withStrip.add(map);
      return map;
    },
  });
}
