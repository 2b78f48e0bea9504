// Python's string formatting for chat templates, which @huggingface/jinja lacks: `"%s-%d" % (a, b)`, str.format
// ('{0}: {name!r:>8}') with the format-spec mini-language, and strftime (transformers' strftime_now, which Llama 3.x
// templates call for the date, with glibc's %-d). Values are printed with Python's str() and repr() (jinja-repr.ts).
import { items, pyFloat, pyQuote, pyRepr, pyStr, type PyValue } from "./jinja-repr.js";

/** One conversion: Python's format-spec mini-language, which `%` conversions also map onto. */
export interface FormatSpec {
  fill: string;
  /** "" is the type's default: left for text, right for numbers. */
  align: "" | "<" | ">" | "=" | "^";
  sign: "-" | "+" | " ";
  alternate: boolean;
  width: number;
  precision: number | null;
  /** thousands separator of format() ("," or "_"), else "". */
  grouping: string;
  /** s r a c d x X o b e E f F g G % or "" (str() for text, repr-like for numbers). */
  type: string;
}

const NUMERIC = new Set(["IntegerValue", "FloatValue", "BooleanValue"]);

/** x in exponent form with `digits` decimals and Python's two-digit exponent (1.500000e+00). */
const exponent = (x: number, digits: number) => x.toExponential(digits).replace(/e([+-])(\d)$/, "e$10$2");

/** Python's 'g': fixed or exponent form by the exponent, `p` significant digits, trailing zeros cut unless `keep`. */
function general(x: number, p: number, keep: boolean): string {
  const digits = Math.max(p, 1);
  const e = x === 0 ? 0 : Number(x.toExponential(digits - 1).split("e")[1]);
  const text = e >= -4 && e < digits ? x.toFixed(digits - 1 - e) : exponent(x, digits - 1);
  if (keep) return text;
  const [mantissa, exp] = text.split("e") as [string, string | undefined];
  const cut = mantissa.includes(".") ? mantissa.replace(/\.?0+$/, "") : mantissa;
  return exp === undefined ? cut : `${cut}e${exp}`;
}

/** The digits of |x| under a numeric conversion type. */
function numberBody(x: number, isFloat: boolean, spec: FormatSpec): string {
  const a = Math.abs(x);
  if (!Number.isFinite(a)) return Number.isNaN(a) ? "nan" : "inf";
  const p = spec.precision;
  const prefix = (s: string) => (spec.alternate ? s : "");
  switch (spec.type) {
    case "d":
      return Math.trunc(a).toString();
    case "x":
      return prefix("0x") + Math.trunc(a).toString(16);
    case "X":
      return prefix("0X") + Math.trunc(a).toString(16).toUpperCase();
    case "o":
      return prefix("0o") + Math.trunc(a).toString(8);
    case "b":
      return prefix("0b") + Math.trunc(a).toString(2);
    case "f":
    case "F":
      return a.toFixed(p ?? 6);
    case "e":
    case "E":
      return exponent(a, p ?? 6);
    case "g":
    case "G":
      return general(a, p ?? 6, spec.alternate);
    case "%":
      return `${(a * 100).toFixed(p ?? 6)}%`;
    default: // "": str() of the number, or 'g'-like with a precision
      return isFloat ? (p === null ? pyFloat(a) : general(a, p, false)) : String(a);
  }
}

/** `sign + body` padded to the spec's width by its fill and alignment. */
function pad(sign: string, body: string, spec: FormatSpec, numeric: boolean): string {
  const n = Math.max(0, spec.width - [...sign, ...body].length);
  const fill = (k: number) => (spec.fill || " ").repeat(k);
  switch (spec.align || (numeric ? ">" : "<")) {
    case "<":
      return sign + body + fill(n);
    case "^":
      return fill(Math.floor(n / 2)) + sign + body + fill(n - Math.floor(n / 2));
    case "=":
      return sign + fill(n) + body;
    default:
      return fill(n) + sign + body;
  }
}

/** One value under a conversion (Python's format(value, spec), or a `%` conversion mapped onto a spec). */
export function pyFormatValue(v: PyValue, spec: FormatSpec): string {
  const t = spec.type;
  if (t === "s" || t === "r" || t === "a" || (t === "" && !(v.type === "IntegerValue" || v.type === "FloatValue"))) {
    const text = t === "r" || t === "a" ? pyRepr(v) : pyStr(v);
    return pad("", spec.precision === null ? text : [...text].slice(0, spec.precision).join(""), spec, false);
  }
  if (t === "c") {
    if (v.type === "StringValue" && [...(v.value as string)].length === 1) return pad("", v.value as string, spec, false);
    if (v.type !== "IntegerValue") throw new Error("%c requires an int or a unicode character");
    return pad("", String.fromCodePoint(v.value as number), spec, false);
  }
  if (!NUMERIC.has(v.type)) throw new Error(`format code '${t}' needs a number, not ${v.type === "StringValue" ? "str" : v.type}`);
  const x = Number(v.value);
  const isFloat = v.type === "FloatValue";
  let body = numberBody(x, isFloat, spec);
  if (spec.grouping !== "") body = body.replace(/^(\d+)/, (d) => d.replace(/\B(?=(\d{3})+$)/g, spec.grouping));
  if (/^[EFGX]$/.test(t)) body = body.toUpperCase();
  const negative = x < 0 || (isFloat && Object.is(x, -0));
  return pad(negative ? "-" : spec.sign === "-" ? "" : spec.sign, body, spec, true);
}

/** Python's `text % arg`: a tuple gives the positional values, a dict the `%(name)s` ones, anything else one value. */
export function percentFormat(text: string, arg: PyValue): string {
  const args = arg.type === "TupleValue" ? items(arg) : [arg];
  const mapping = arg.type === "ObjectValue" ? (arg.value as Map<string, PyValue>) : null;
  const conversion = /%(?:\(([^)]*)\))?([-+ #0]*)(\d*)(?:\.(\d*))?(.?)/y;
  let out = "";
  let next = 0;
  let at = 0;
  for (let pct = text.indexOf("%"); pct !== -1; pct = text.indexOf("%", at)) {
    out += text.slice(at, pct);
    conversion.lastIndex = pct;
    const [whole, key, flags = "", width = "", precision, type = ""] = conversion.exec(text)!;
    at = pct + whole.length;
    if (type === "") throw new Error("incomplete format");
    if (type === "%") {
      out += "%";
      continue;
    }
    if (!"sradiuxXoeEfFgGc".includes(type)) {
      throw new Error(`unsupported format character '${type}' (0x${type.codePointAt(0)!.toString(16)}) at index ${at - 1}`);
    }
    let value: PyValue | undefined;
    if (key !== undefined) {
      if (mapping === null) throw new Error("format requires a mapping");
      value = mapping.get(key);
      if (value === undefined) throw new Error(`KeyError: ${pyQuote(key)}`);
    } else {
      value = args[next++];
      if (value === undefined) throw new Error("not enough arguments for format string");
    }
    const zero = flags.includes("0") && !flags.includes("-") && !"srac".includes(type);
    out += pyFormatValue(value, {
      fill: zero ? "0" : " ",
      align: flags.includes("-") ? "<" : zero ? "=" : ">",
      sign: flags.includes("+") ? "+" : flags.includes(" ") ? " " : "-",
      alternate: flags.includes("#"),
      width: Number(width),
      precision: precision === undefined ? null : Number(precision),
      grouping: "",
      type: type === "i" || type === "u" ? "d" : type,
    });
  }
  if (mapping === null && next < args.length) throw new Error("not all arguments converted during string formatting");
  return out + text.slice(at);
}

const SPEC = /^(?:([\s\S])?([<>=^]))?([-+ ])?(#)?(0)?(\d+)?([,_])?(?:\.(\d+))?([bcdeEfFgGosxX%])?$/;

/** Python's str.format: {} / {0} / {name}, !r / !s / !a, and a format spec after ':'; {{ and }} are braces. */
export function strFormat(text: string, args: PyValue[], kwargs: Map<string, PyValue>): string {
  let out = "";
  let auto = 0;
  for (let i = 0; i < text.length; ) {
    const ch = text[i]!;
    if ((ch === "{" || ch === "}") && text[i + 1] === ch) {
      out += ch;
      i += 2;
      continue;
    }
    if (ch === "}") throw new Error("Single '}' encountered in format string");
    if (ch !== "{") {
      out += ch;
      i++;
      continue;
    }
    const end = text.indexOf("}", i);
    if (end === -1) throw new Error("Single '{' encountered in format string");
    const [, name = "", conversion, specText = ""] = /^([^!:]*)(?:!(.))?(?::([\s\S]*))?$/.exec(text.slice(i + 1, end))!;
    i = end + 1;
    let value = name === "" ? args[auto++] : /^\d+$/.test(name) ? args[Number(name)] : kwargs.get(name);
    if (value === undefined) {
      throw new Error(/^\d*$/.test(name) ? `Replacement index ${name || auto - 1} out of range for positional args tuple` : `KeyError: ${pyQuote(name)}`);
    }
    if (conversion !== undefined) {
      if (!"rsa".includes(conversion)) throw new Error(`Unknown conversion specifier ${conversion}`);
      value = { type: "StringValue", value: conversion === "s" ? pyStr(value) : pyRepr(value) };
    }
    const m = SPEC.exec(specText);
    if (m === null) throw new Error(`Invalid format specifier '${specText}'`);
    const [, fill = "", align = "", sign = "-", alternate, zero, width = "0", grouping = "", precision, type = ""] = m;
    out += pyFormatValue(value, {
      fill: fill || (zero !== undefined && align === "" ? "0" : " "),
      align: (align || (zero !== undefined ? "=" : "")) as FormatSpec["align"],
      sign: sign as FormatSpec["sign"],
      alternate: alternate !== undefined,
      width: Number(width),
      precision: precision === undefined ? null : Number(precision),
      grouping,
      type,
    });
  }
  return out;
}

const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

/**
 * Python's date.strftime in the C locale, with glibc's flags (%-d: no padding, %_d: spaces): %a %A %b %B %d %e %H %I
 * %j %m %M %p %S %y %Y %%; any other directive stays as written.
 */
export function pyStrftime(date: Date, format: string): string {
  const startOfYear = new Date(date.getFullYear(), 0, 1);
  const dayOfYear = Math.round((new Date(date.getFullYear(), date.getMonth(), date.getDate()).getTime() - startOfYear.getTime()) / 86_400_000) + 1;
  return format.replace(/%([-_0]?)([a-zA-Z%])/g, (whole, flag: string, d: string) => {
    const num = (n: number, width = 2, padChar = "0") => {
      const p = flag === "-" ? "" : flag === "_" ? " " : flag === "0" ? "0" : padChar;
      return p === "" ? String(n) : String(n).padStart(width, p);
    };
    switch (d) {
      case "a":
        return DAYS[date.getDay()]!.slice(0, 3);
      case "A":
        return DAYS[date.getDay()]!;
      case "b":
      case "h":
        return MONTHS[date.getMonth()]!.slice(0, 3);
      case "B":
        return MONTHS[date.getMonth()]!;
      case "d":
        return num(date.getDate());
      case "e":
        return num(date.getDate(), 2, " ");
      case "H":
        return num(date.getHours());
      case "I":
        return num(date.getHours() % 12 || 12);
      case "j":
        return num(dayOfYear, 3);
      case "m":
        return num(date.getMonth() + 1);
      case "M":
        return num(date.getMinutes());
      case "p":
        return date.getHours() < 12 ? "AM" : "PM";
      case "S":
        return num(date.getSeconds());
      case "y":
        return num(date.getFullYear() % 100);
      case "Y":
        return String(date.getFullYear());
      case "%":
        return "%";
      default:
        return whole;
    }
  });
}
