// Reads a reply written as a Python list of calls, `[get_weather(city="Oslo", days=2), get_time()]`, as vLLM's
// PythonicToolParser reads it with Python's ast: each call a plain name with keyword arguments whose values are
// literals (str, int, float, True/False/None, and lists and dicts of them; JSON's null/true/false are taken too).
// Anything else (positional arguments, names, expressions, f-strings, bytes, tuples, sets, text around the
// list) makes it no call list, and the reply stays text.
import { PyDict, type PyKey, type PyValue } from "./python-json.js";

/** One call of the list: the function's name and its keyword arguments in order. */
export interface PythonCall {
  name: string;
  args: PyDict;
}

class NotACallList extends Error {}

const fail = (): never => {
  throw new NotACallList();
};

// Python's keywords cannot name a function or an argument (True, None and False are keywords too)
const KEYWORDS = new Set(
  ("False None True and as assert async await break class continue def del elif else except finally for from global if " +
    "import in is lambda nonlocal not or pass raise return try while with yield").split(" "),
);
const IDENTIFIER = /[\p{L}\p{Nl}_][\p{L}\p{Nl}\p{Mn}\p{Mc}\p{Nd}\p{Pc}]*/uy;
// inside brackets, newlines are spaces; `#` comments run to the end of the line; `\` + newline joins lines
const SPACE = /(?:[ \t\f\n]|#[^\n]*|\\\n)*/y;
const DIGITS = "[0-9](?:_?[0-9])*";
const EXPONENT = `[eE][-+]?${DIGITS}`;
const FLOAT = new RegExp(`(?:${DIGITS})?\\.${DIGITS}(?:${EXPONENT})?|${DIGITS}\\.(?:${EXPONENT})?|${DIGITS}${EXPONENT}`, "y");
const INT = /0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+|[1-9](?:_?[0-9])*|0+(?:_?0)*/y;
const STRING_START = /([A-Za-z]{0,2})('''|"""|'|")/y;
const HEX_ESCAPE_LENGTHS: Record<string, number> = { x: 2, u: 4, U: 8 };
const SIMPLE_ESCAPES: Record<string, string> = {
  "\\": "\\", "'": "'", '"': '"', a: "\x07", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t", v: "\v",
};

/** The calls of a reply that is one Python list of calls (whitespace around it aside), or null when it is not. */
export function readPythonCalls(text: string): PythonCall[] | null {
  try {
    return new CallListReader(text.replace(/\r\n?/g, "\n")).read(); // Python reads \r\n and \r as \n
  } catch (e) {
    if (e instanceof NotACallList) return null;
    throw e;
  }
}

/**
 * Python's ast.literal_eval(text) over the literals read here (JSON's null/true/false are names to Python, so no
 * literal), or undefined when the text is none. vLLM's qwen3_coder parser reads untyped parameter values with it.
 */
export function readPythonLiteral(text: string): PyValue | undefined {
  try {
    return new CallListReader(text.replace(/\r\n?/g, "\n"), false).readLiteral();
  } catch (e) {
    if (e instanceof NotACallList) return undefined;
    throw e;
  }
}

class CallListReader {
  private pos = 0;

  constructor(
    private readonly text: string,
    /** JSON's null/true/false are taken as Python's None/True/False (vLLM's pythonic parser takes them). */
    private readonly jsonNames = true,
  ) {}

  /** One literal, whitespace around it aside. */
  readLiteral(): PyValue {
    const value = this.literal();
    this.space();
    if (this.pos < this.text.length) fail();
    return value;
  }

  read(): PythonCall[] {
    this.pos = this.text.search(/\S/) + 1;
    if (this.text[this.pos - 1] !== "[") fail();
    const calls: PythonCall[] = [];
    while (!this.take("]")) {
      calls.push(this.call());
      this.separator("]");
    }
    if (calls.length === 0 || /\S/.test(this.text.slice(this.pos))) fail();
    return calls;
  }

  /** `name(key=literal, ...)`. */
  private call(): PythonCall {
    const name = this.identifier();
    this.expect("(");
    const args = new PyDict();
    while (!this.take(")")) {
      const key = this.identifier();
      this.expect("=");
      if (this.text[this.pos] === "=" || args.has(key)) fail(); // `a == 1` is a comparison; a repeated keyword does not parse
      args.set(key, this.literal());
      this.separator(")");
    }
    return { name, args };
  }

  /** A name that can be a function's or an argument's (no keyword). */
  private identifier(): string {
    const name = this.word();
    return KEYWORDS.has(name) ? fail() : name;
  }

  private word(): string {
    this.space();
    IDENTIFIER.lastIndex = this.pos;
    const m = IDENTIFIER.exec(this.text);
    if (m === null) return fail();
    this.pos = IDENTIFIER.lastIndex;
    return m[0];
  }

  private literal(): PyValue {
    this.space();
    const c = this.text[this.pos];
    if (this.take("[")) {
      const list: PyValue[] = [];
      while (!this.take("]")) {
        list.push(this.literal());
        this.separator("]");
      }
      return list;
    }
    if (this.take("{")) {
      const dict = new PyDict();
      while (!this.take("}")) {
        const key = this.constant();
        this.expect(":");
        dict.set(key, this.literal());
        this.separator("}");
      }
      return dict;
    }
    if (this.take("(")) {
      const inner = this.literal(); // parentheses around one value are no tuple
      this.expect(")");
      return inner;
    }
    if (c !== undefined && /[A-Za-z_]/.test(c) && !this.atString()) {
      const name = this.word();
      const named: Record<string, PyValue> = { True: true, False: false, None: null, ...(this.jsonNames ? { true: true, false: false, null: null } : {}) };
      if (!(name in named)) fail();
      return named[name]!;
    }
    return this.constant();
  }

  /** A constant (a dict key must be one): a string, a number with an optional sign, True, False or None. */
  private constant(): PyKey {
    this.space();
    if (this.atString()) return this.strings();
    for (const [word, value] of [["True", true], ["False", false], ["None", null]] as const) {
      if (this.text.startsWith(word, this.pos) && !this.identifierCharAt(this.pos + word.length)) {
        this.pos += word.length;
        return value;
      }
    }
    // a sign makes a UnaryOp to Python's ast, which vLLM refuses (vllm-project/vllm#44777): Kiln takes it as
    // ast.literal_eval does, so that `value=-5` is a call and not text
    let sign = 1;
    if (this.text[this.pos] === "-" || this.text[this.pos] === "+") {
      sign = this.text[this.pos] === "-" ? -1 : 1;
      this.pos++;
      this.space();
    }
    return this.number(sign);
  }

  private number(sign: number): bigint | number {
    for (const re of [FLOAT, INT]) {
      re.lastIndex = this.pos;
      const m = re.exec(this.text);
      if (m === null) continue;
      this.pos = re.lastIndex;
      // `1j` is complex, `01` and `1_` do not parse, `1abc` is no number
      if (this.identifierCharAt(this.pos) || this.text[this.pos] === ".") fail();
      const digits = m[0].replace(/_/g, "");
      if (re === FLOAT) return sign * Number(digits);
      const n = BigInt(digits);
      return sign < 0 ? -n : n;
    }
    return fail();
  }

  private atString(): boolean {
    STRING_START.lastIndex = this.pos;
    return STRING_START.test(this.text);
  }

  /** One string literal or several side by side (Python joins them: `"a" 'b'` is "ab"). */
  private strings(): string {
    let out = "";
    do out += this.string();
    while ((this.space(), this.atString()));
    return out;
  }

  private string(): string {
    STRING_START.lastIndex = this.pos;
    const m = STRING_START.exec(this.text)!;
    const prefix = m[1]!.toLowerCase();
    if (prefix !== "" && prefix !== "r" && prefix !== "u") fail(); // bytes and f-strings are no str constant
    const quote = m[2]!;
    const raw = prefix === "r";
    this.pos = STRING_START.lastIndex;
    let out = "";
    for (;;) {
      if (this.text.startsWith(quote, this.pos)) {
        this.pos += quote.length;
        return out;
      }
      const c = this.text[this.pos];
      if (c === undefined || (quote.length === 1 && c === "\n")) fail(); // unterminated
      if (c !== "\\") {
        out += c;
        this.pos++;
      } else if (raw) {
        // a raw string keeps its backslashes, but one still stops the next quote from closing it
        if (this.text[this.pos + 1] === undefined) fail();
        out += this.text.slice(this.pos, this.pos + 2);
        this.pos += 2;
      } else out += this.escape();
    }
  }

  /** The escape sequence at pos (a backslash), as Python reads it in a str literal. */
  private escape(): string {
    const e = this.text[this.pos + 1];
    if (e === undefined) return fail();
    this.pos += 2;
    if (e in SIMPLE_ESCAPES) return SIMPLE_ESCAPES[e]!;
    if (e === "\n") return ""; // a backslash at the end of a line continues the string
    const octal = /^[0-7]{1,3}/.exec(this.text.slice(this.pos - 1, this.pos + 2));
    if (octal !== null) {
      this.pos += octal[0].length - 1;
      return String.fromCodePoint(parseInt(octal[0], 8));
    }
    const hexLength = HEX_ESCAPE_LENGTHS[e];
    if (hexLength !== undefined) {
      const hex = this.text.slice(this.pos, this.pos + hexLength);
      if (!new RegExp(`^[0-9a-fA-F]{${hexLength}}$`).test(hex)) fail();
      const code = parseInt(hex, 16);
      if (code > 0x10ffff) fail();
      this.pos += hexLength;
      return String.fromCodePoint(code);
    }
    if (e === "N") fail(); // \N{NAME} needs Unicode's name table, which Kiln does not carry
    return `\\${e}`; // Python keeps an unknown escape as written (with a warning)
  }

  private identifierCharAt(at: number): boolean {
    const c = this.text[at];
    return c !== undefined && /[\p{L}\p{N}_]/u.test(c);
  }

  private space(): void {
    SPACE.lastIndex = this.pos;
    SPACE.exec(this.text);
    this.pos = SPACE.lastIndex;
  }

  /** Skips space, then takes `token` if it is next. */
  private take(token: string): boolean {
    this.space();
    if (!this.text.startsWith(token, this.pos)) return false;
    this.pos += token.length;
    return true;
  }

  private expect(token: string): void {
    if (!this.take(token)) fail();
  }

  /** After an item: a comma, or else the closing bracket must come next (the loop takes it). */
  private separator(close: string): void {
    if (!this.take(",") && !this.text.startsWith(close, this.pos)) fail();
  }
}
