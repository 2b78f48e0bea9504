// Lark grammars as vLLM's xgrammar back end takes them (vllm/v1/structured_output/utils.py): a grammar with no
// `::=` rule is read as Lark and converted to EBNF line by line (`rule: a | b` -> `rule ::= a | b`, `|` lines
// continue the rule above, 'x' -> "x", comments dropped, the root is `start` or else the first rule). Only that
// subset converts: terminals written as /regex/ or imported with %import do not.

const stripComment = (line: string): string => line.replace(/(#|\/\/).*$/, "").trim();

/** vLLM's grammar_is_likely_lark: no line (comments aside) defines an EBNF rule. */
export function grammarIsLikelyLark(grammar: string): boolean {
  return !grammar.split("\n").some((line) => stripComment(line).includes("::="));
}

/** The names a rule's definition refers to (quoted text and operators aside). */
function references(definition: string): string[] {
  const bare = definition.replace(/"[^"]*"/g, "").replace(/[+*?()|[\]{}]/g, " ");
  return bare.match(/\b[a-zA-Z_][a-zA-Z0-9_]*\b/g) ?? [];
}

/** A definition's quotes checked, and its 'x' literals written "x". */
function definitionOf(text: string, what: string, lineNo: number): string {
  if ((text.split("'").length - 1) % 2 !== 0 || (text.split('"').length - 1) % 2 !== 0)
    throw new Error(`Error on line ${lineNo}: Mismatched quotes in ${what} on line ${lineNo}`);
  return text.replace(/'([^']*)'/g, '"$1"');
}

/** vLLM's convert_lark_to_ebnf. Throws an Error saying what does not convert. */
export function larkToEbnf(grammar: string): string {
  if (grammar.trim().length === 0) throw new Error("Grammar string cannot be empty");
  const lines = grammar.split("\n").map(stripComment);
  const defined = new Set<string>();
  let root: string | null = null;
  for (const line of lines) {
    if (line.length === 0 || line.startsWith("|") || !line.includes(":")) continue;
    const name = line.slice(0, line.indexOf(":")).trim().replace(/^\?+|\?+$/g, "");
    defined.add(name);
    if (root === null || name === "start") root = name;
  }
  if (root === null) throw new Error("No valid rules found in grammar");
  const out = [`root ::= ${root}`];
  const referenced = new Set<string>();
  let rule: { name: string; alternatives: string[] } | null = null;
  const flush = (): void => {
    if (rule !== null) out.push(`${rule.name} ::= ${rule.alternatives.join(" | ")}`);
  };
  lines.forEach((line, i) => {
    if (line.length === 0) return;
    if (line.startsWith("|")) {
      if (rule === null) throw new Error(`Error on line ${i + 1}: Alternative '|' on line ${i + 1} without a preceding rule definition`);
      const alternative = definitionOf(line.slice(1).trim(), `alternative for rule '${rule.name}'`, i + 1);
      for (const r of references(alternative)) referenced.add(r);
      rule.alternatives.push(alternative);
    } else if (line.includes(":")) {
      flush();
      const at = line.indexOf(":");
      const name = line.slice(0, at).trim().replace(/^\?+|\?+$/g, "");
      const definition = definitionOf(line.slice(at + 1), `rule '${name}'`, i + 1);
      for (const r of references(definition)) referenced.add(r);
      rule = { name, alternatives: [definition.trim()] };
    }
  });
  flush();
  const undefinedRules = [...referenced].filter((r) => !defined.has(r) && r !== "root").sort();
  if (undefinedRules.length > 0) throw new Error(`Referenced rules are not defined: ${undefinedRules.join(", ")}`);
  return out.join("\n");
}
