// The xgrammar build Kiln uses (@mlc-ai/web-xgrammar 0.1.27) matches a character class's non-ASCII members byte by
// byte: `[\0-\U0010ffff]` takes one byte of "é" and stops there (invalid UTF-8), `[\xa0]` takes the lone byte 0xA0 and
// refuses U+00A0 itself. Its own conversions write such classes: a regex's `.` becomes `[\0-\U0010ffff]`, `\s`
// becomes `[\f\n\r\t\v \xa0]`, and the JSON-pointer formats hold `[\x7f-\U0010ffff]`. What it does match by character
// is a class of ASCII members, negated ones (`[^\0-\x7f]` is any one non-ASCII character) and string literals. So a
// converted grammar's classes are respelled in those: the ASCII part stays a class, all of U+0080..U+10FFFF becomes
// `[^\0-\x7f]`, a few single characters become literals.

/** Code point ranges [lo, hi], inclusive. */
type Ranges = [number, number][];

const ESCAPES: Record<string, number> = { "0": 0, a: 7, b: 8, t: 9, n: 10, v: 11, f: 12, r: 13, e: 27 };
const HEX_DIGITS: Record<string, number> = { x: 2, u: 4, U: 8 };
const LAST = 0x10ffff;
/** The most single non-ASCII characters a class may list to be respelled as literals. */
const MAX_LITERALS = 64;

/** The character at `i` of a class's text (an escape as xgrammar prints them, or a literal): its code point and end. */
function classChar(text: string, i: number): { cp: number; end: number } {
  if (text[i] !== "\\") {
    const cp = text.codePointAt(i)!;
    return { cp, end: i + (cp > 0xffff ? 2 : 1) };
  }
  const c = text[i + 1]!;
  const digits = HEX_DIGITS[c];
  if (digits !== undefined) return { cp: parseInt(text.slice(i + 2, i + 2 + digits), 16), end: i + 2 + digits };
  return { cp: ESCAPES[c] ?? c.codePointAt(0)!, end: i + 2 };
}

/** The ranges of the class whose text starts after `[` (or `[^`) at `i`, and the index of its `]`. */
function classRanges(text: string, i: number): { ranges: Ranges; end: number } {
  const ranges: Ranges = [];
  while (i < text.length && text[i] !== "]") {
    const lo = classChar(text, i);
    i = lo.end;
    if (text[i] === "-" && text[i + 1] !== "]") {
      const hi = classChar(text, i + 1);
      ranges.push([lo.cp, hi.cp]);
      i = hi.end;
    } else ranges.push([lo.cp, lo.cp]);
  }
  return { ranges, end: i };
}

const hex = (cp: number): string => (cp <= 0xff ? `\\x${cp.toString(16).padStart(2, "0")}` : `\\U${cp.toString(16).padStart(8, "0")}`);

/** A positive class's members as alternatives this build matches by character, or null when they cannot be. */
function respell(ranges: Ranges): string | null {
  const ascii = ranges.filter(([lo]) => lo <= 0x7f).map(([lo, hi]): [number, number] => [lo, Math.min(hi, 0x7f)]);
  const other = ranges.filter(([, hi]) => hi > 0x7f).map(([lo, hi]): [number, number] => [Math.max(lo, 0x80), hi]).sort((a, b) => a[0] - b[0]);
  const alts = ascii.length > 0 ? [`[${ascii.map(([lo, hi]) => (lo === hi ? hex(lo) : `${hex(lo)}-${hex(hi)}`)).join("")}]`] : [];
  let reach = 0x7f; // all of 0x80..reach is covered
  for (const [lo, hi] of other) if (lo <= reach + 1) reach = Math.max(reach, hi);
  if (reach >= LAST) return `(${[...alts, "[^\\0-\\x7f]"].join(" | ")})`;
  if (other.reduce((n, [lo, hi]) => n + hi - lo + 1, 0) > MAX_LITERALS) return null;
  const singles = other.flatMap(([lo, hi]) => Array.from({ length: hi - lo + 1 }, (_, k) => lo + k));
  return `(${[...alts, ...singles.map((cp) => JSON.stringify(String.fromCodePoint(cp)))].join(" | ")})`;
}

/**
 * xgrammar EBNF text (as Grammar.ToString prints it) with every positive class holding non-ASCII members respelled
 * (see the file comment); the text itself when it has none; null when a class cannot be respelled.
 */
export function respellNonAsciiClasses(ebnf: string): string | null {
  let out = "";
  let from = 0;
  for (let i = 0; i < ebnf.length; i++) {
    const c = ebnf[i]!;
    if (c === '"') {
      for (i++; i < ebnf.length && ebnf[i] !== '"'; i++) if (ebnf[i] === "\\") i++;
      continue;
    }
    if (c !== "[") continue;
    const negated = ebnf[i + 1] === "^";
    const { ranges, end } = classRanges(ebnf, i + (negated ? 2 : 1));
    if (!negated && ranges.some(([, hi]) => hi > 0x7f)) {
      const spelled = respell(ranges);
      if (spelled === null) return null;
      out += ebnf.slice(from, i) + spelled;
      from = end + 1;
    }
    i = end;
  }
  return from === 0 ? ebnf : out + ebnf.slice(from);
}
