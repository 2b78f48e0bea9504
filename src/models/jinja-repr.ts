// Python's str() and repr() of chat-template values, as Jinja2 prints them: True / False / None, lists and dicts as
// [1, 'a'] and {'a': 1}, tuples as (1,), floats as 1.0 and 1e-05. @huggingface/jinja prints them as JavaScript and
// JSON would (true, "", [1, "a"]); transformers renders templates with Python's Jinja2.

/** A runtime value of @huggingface/jinja: its type name and JS payload (a Map for dicts and namespaces). */
export interface PyValue {
  readonly type: string;
  value: unknown;
}

export const items = (v: PyValue): PyValue[] => v.value as PyValue[];
export const entries = (v: PyValue): [string, PyValue][] => [...(v.value as Map<string, PyValue>)];

/** Python's repr of a str: single quotes unless it holds ' and no ", non-printable characters escaped. */
export function pyQuote(text: string): string {
  const q = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = q;
  for (const ch of text) {
    const cp = ch.codePointAt(0)!;
    if (ch === q || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch !== " " && /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Z}]/u.test(ch)) {
      out += cp < 0x100 ? `\\x${cp.toString(16).padStart(2, "0")}` : cp < 0x10000 ? `\\u${cp.toString(16).padStart(4, "0")}` : `\\U${cp.toString(16).padStart(8, "0")}`;
    } else out += ch;
  }
  return out + q;
}

/** Python's repr of a float: the shortest digits, in exponent form below 1e-4 and from 1e16 (1e-05, 1.5e+16). */
export function pyFloat(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (Object.is(x, -0)) return "-0.0";
  const [mantissa, exp] = x.toExponential().split("e") as [string, string];
  const e = Number(exp);
  if (e < -4 || e >= 16) return `${mantissa}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  const fixed = x.toString(); // JS writes fixed notation for these exponents
  return fixed.includes(".") ? fixed : `${fixed}.0`;
}

/** Python's repr() of a template value. */
export function pyRepr(v: PyValue): string {
  switch (v.type) {
    case "StringValue":
      return pyQuote(v.value as string);
    case "BooleanValue":
      return v.value ? "True" : "False";
    case "NullValue":
      return "None";
    case "UndefinedValue":
      return "Undefined";
    case "FloatValue":
      return pyFloat(v.value as number);
    case "ArrayValue":
      return `[${items(v).map(pyRepr).join(", ")}]`;
    case "TupleValue":
      return items(v).length === 1 ? `(${pyRepr(items(v)[0]!)},)` : `(${items(v).map(pyRepr).join(", ")})`;
    case "ObjectValue":
    case "KeywordArgumentsValue":
      return `{${entries(v).map(([k, x]) => `${pyQuote(k)}: ${pyRepr(x)}`).join(", ")}}`;
    case "NamespaceValue":
      return `<Namespace {${entries(v).map(([k, x]) => `${pyQuote(k)}: ${pyRepr(x)}`).join(", ")}}>`;
    default:
      return String(v.value);
  }
}

/** Python's str() of a template value, as `{{ }}` prints it (an undefined value prints nothing). */
export function pyStr(v: PyValue): string {
  if (v.type === "StringValue") return v.value as string;
  return v.type === "UndefinedValue" ? "" : pyRepr(v);
}


/** json.dumps's options as transformers' tojson filter passes them (ensure_ascii off by default). */
export interface JsonOptions {
  /** null: one line; a number of spaces or a string: one item a line, indented (0 or "": newlines only). */
  indent: number | string | null;
  ensureAscii: boolean;
  sortKeys: boolean;
  /** [item, key] separators; null: json.dumps's default (", " or "," with an indent, and ": "). */
  separators: [string, string] | null;
}

/** Python's json.dumps of a template value: floats as repr (1.0, 1e-05, NaN, Infinity), tuples as arrays. */
export function pyJson(v: PyValue, options: JsonOptions, depth = 0): string {
  const { indent, ensureAscii, sortKeys } = options;
  const [itemSep, keySep] = options.separators ?? [indent === null ? ", " : ",", ": "];
  const text = (s: string) => {
    const quoted = JSON.stringify(s);
    return ensureAscii ? quoted.replace(/[\x7f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`) : quoted;
  };
  const block = (open: string, parts: string[], close: string) => {
    if (indent === null || parts.length === 0) return open + parts.join(itemSep) + close;
    const unit = typeof indent === "number" ? " ".repeat(indent) : indent;
    const inner = "\n" + unit.repeat(depth + 1);
    return open + inner + parts.join(itemSep + inner) + "\n" + unit.repeat(depth) + close;
  };
  switch (v.type) {
    case "NullValue":
    case "UndefinedValue":
      return "null";
    case "BooleanValue":
      return v.value ? "true" : "false";
    case "IntegerValue":
      return String(v.value);
    case "FloatValue": {
      const x = v.value as number;
      return Number.isNaN(x) ? "NaN" : !Number.isFinite(x) ? (x > 0 ? "Infinity" : "-Infinity") : pyFloat(x);
    }
    case "StringValue":
      return text(v.value as string);
    case "ArrayValue":
    case "TupleValue":
      return block("[", items(v).map((x) => pyJson(x, options, depth + 1)), "]");
    case "ObjectValue":
    case "KeywordArgumentsValue": {
      const pairs = entries(v);
      if (sortKeys) pairs.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)); // Python's sorted() order, not localeCompare's
      return block("{", pairs.map(([k, x]) => `${text(k)}${keySep}${pyJson(x, options, depth + 1)}`), "}");
    }
    default:
      throw new Error(`Object of type ${v.type.replace(/Value$/, "")} is not JSON serializable`);
  }
}
