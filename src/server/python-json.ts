// Python values as vLLM's tool-call parsers see them, and Python's json module over them: a call's arguments are
// json.dumps(value, ensure_ascii=False) of what json.loads (llama3_json) or Python's ast (pythonic) read. Reading
// into JS values would change the text: 1.0 would print as 1, big ints would round, and keys like "2" would move
// to the front of an object; here ints stay exact and apart from floats, and dicts keep their insertion order.

/** A Python value: None, bool, int (bigint), float (number), str, list or dict. */
export type PyValue = null | boolean | bigint | number | string | PyValue[] | PyDict;
/** What a dict key can be here: the hashable constants a literal can write. */
export type PyKey = null | boolean | bigint | number | string;

/** A Python dict: keys in first-insertion order; an equal key (1, 1.0 and True are equal) replaces the value. */
export class PyDict {
  readonly entries: [PyKey, PyValue][] = [];
  private readonly slots = new Map<string, number>(); // key identity -> index into entries

  set(key: PyKey, value: PyValue): void {
    const id = keyIdentity(key);
    const at = this.slots.get(id);
    if (at !== undefined) this.entries[at]![1] = value;
    else {
      this.slots.set(id, this.entries.length);
      this.entries.push([key, value]);
    }
  }

  has(key: PyKey): boolean {
    return this.slots.has(keyIdentity(key));
  }

  get(key: PyKey): PyValue | undefined {
    const at = this.slots.get(keyIdentity(key));
    return at === undefined ? undefined : this.entries[at]![1];
  }
}

/** Equal Python keys share an identity: numbers by value (True is 1), strings by text. */
function keyIdentity(key: PyKey): string {
  if (typeof key === "string") return `s${key}`;
  if (key === null) return "none";
  const n = typeof key === "boolean" ? BigInt(key) : key;
  if (typeof n === "bigint") return `n${n}`;
  return Number.isInteger(n) ? `n${BigInt(n)}` : `f${n}`;
}

/** Python's repr of a float (shortest round-trip digits; exponent form below 1e-4 and from 1e16). */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  const [mantissa, exp] = Math.abs(x).toExponential().split("e") as [string, string];
  const digits = mantissa.replace(".", "");
  const point = Number(exp) + 1; // the value is 0.<digits> * 10^point
  if (point <= -4 || point > 16) {
    const e = point - 1;
    const frac = digits.length > 1 ? `.${digits.slice(1)}` : "";
    return `${sign}${digits[0]}${frac}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  }
  if (point <= 0) return `${sign}0.${"0".repeat(-point)}${digits}`;
  if (point >= digits.length) return `${sign}${digits}${"0".repeat(point - digits.length)}.0`;
  return `${sign}${digits.slice(0, point)}.${digits.slice(point)}`;
}

// json.dumps writes NaN and the infinities as JavaScript does (allow_nan=True)
const floatJson = (x: number): string => (Number.isNaN(x) ? "NaN" : Number.isFinite(x) ? pyFloatRepr(x) : x > 0 ? "Infinity" : "-Infinity");

/**
 * json.dumps's string: quotes, backslashes and control characters escaped; everything else as is (ensure_ascii=False),
 * or (`ascii`) every character outside printable ASCII as \uXXXX of its UTF-16 units, as ensure_ascii=True writes it.
 */
function stringJson(s: string, ascii = false): string {
  const escaped = s.replace(ascii ? /[^ -~]|["\\]/g : /[\u0000-\u001f"\\]/g, (c) => {
    const short: Record<string, string> = { '"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f" };
    return short[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`;
  });
  return `"${escaped}"`;
}

/** A dict key as json.dumps writes it: str as is; numbers, bools and None as their JSON text. */
function keyText(key: PyKey): string {
  if (typeof key === "string") return key;
  if (typeof key === "number") return floatJson(key);
  return key === null ? "null" : String(key);
}

/** Python's json.dumps(value, ensure_ascii=False): `{"a": 1, "b": [1.5, true]}`, separators ", " and ": ". */
export const pyJsonDumps = (v: PyValue): string => dumps(v, false);

/** Python's json.dumps(value) with its default ensure_ascii=True: non-ASCII characters as \uXXXX escapes. */
export const pyJsonDumpsAscii = (v: PyValue): string => dumps(v, true);

function dumps(v: PyValue, ascii: boolean): string {
  if (v === null) return "null";
  switch (typeof v) {
    case "boolean":
    case "bigint":
      return String(v);
    case "number":
      return floatJson(v);
    case "string":
      return stringJson(v, ascii);
  }
  if (Array.isArray(v)) return `[${v.map((x) => dumps(x, ascii)).join(", ")}]`;
  return `{${v.entries.map(([k, x]) => `${stringJson(keyText(k), ascii)}: ${dumps(x, ascii)}`).join(", ")}}`;
}

/** Malformed JSON (a JSONDecodeError to Python). */
export class PyJsonError extends Error {
  constructor(message: string, at: number) {
    super(`[json] ${message} at character ${at}`);
  }
}

const JSON_SPACE = /[ \t\n\r]*/y;
const JSON_NUMBER = /(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?/y;
const JSON_ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

/**
 * Python's json.JSONDecoder().raw_decode(text[at:]): the one JSON value that starts at `at` and where it ends.
 * Strict as Python is (no control characters in strings, no trailing commas), with its NaN and Infinity.
 */
export function pyJsonDecode(text: string, at: number): { value: PyValue; end: number } {
  let pos = at;
  const fail = (what: string): never => {
    throw new PyJsonError(what, pos);
  };
  const space = (): void => {
    JSON_SPACE.lastIndex = pos;
    JSON_SPACE.exec(text);
    pos = JSON_SPACE.lastIndex;
  };
  const word = (w: string): boolean => (text.startsWith(w, pos) ? ((pos += w.length), true) : false);
  const str = (): string => {
    pos++; // the opening quote
    let out = "";
    for (;;) {
      const c = text[pos];
      if (c === undefined) fail("Unterminated string");
      if (c === '"') break;
      if (c! < " ") fail("Invalid control character");
      if (c !== "\\") {
        out += c;
        pos++;
        continue;
      }
      const e = text[pos + 1];
      if (e === "u") {
        const hex = text.slice(pos + 2, pos + 6);
        if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("Invalid \\uXXXX escape");
        out += String.fromCharCode(parseInt(hex, 16)); // a surrogate pair is two escapes, as in a JS string
        pos += 6;
      } else {
        if (e === undefined || !(e in JSON_ESCAPES)) fail("Invalid \\escape");
        out += JSON_ESCAPES[e!];
        pos += 2;
      }
    }
    pos++;
    return out;
  };
  const value = (): PyValue => {
    const c = text[pos];
    if (c === '"') return str();
    if (c === "{") {
      pos++;
      const dict = new PyDict();
      space();
      if (word("}")) return dict;
      for (;;) {
        if (text[pos] !== '"') fail("Expecting property name enclosed in double quotes");
        const key = str();
        space();
        if (!word(":")) fail("Expecting ':' delimiter");
        space();
        dict.set(key, value());
        space();
        if (word("}")) return dict;
        if (!word(",")) fail("Expecting ',' delimiter");
        space();
      }
    }
    if (c === "[") {
      pos++;
      const list: PyValue[] = [];
      space();
      if (word("]")) return list;
      for (;;) {
        list.push(value());
        space();
        if (word("]")) return list;
        if (!word(",")) fail("Expecting ',' delimiter");
        space();
      }
    }
    if (word("null")) return null;
    if (word("true")) return true;
    if (word("false")) return false;
    if (word("NaN")) return NaN;
    if (word("Infinity")) return Infinity;
    if (word("-Infinity")) return -Infinity;
    JSON_NUMBER.lastIndex = pos;
    const m = JSON_NUMBER.exec(text);
    if (m === null) return fail("Expecting value");
    pos = JSON_NUMBER.lastIndex;
    return m[2] === undefined && m[3] === undefined ? BigInt(m[1]!) : Number(m[0]);
  };
  const v = value();
  return { value: v, end: pos };
}
