// Chat templates rendered with Python's Jinja2 semantics where @huggingface/jinja follows JavaScript's, as
// transformers (and so vLLM) renders them: `{{ true }}` prints True, `{{ none }}` None, a list or dict its repr;
// `~`, |string and |join take str() of any value; `"%s-%d" % (a, b)` formats; `1 < x < 3` is a chain; the globals are
// Jinja2's and transformers' (strftime_now as Python's strftime). The library exports its Interpreter but not its
// value classes: those are reached through values an Environment converts, and the methods replaced once per process.
import { Environment, Interpreter, parse, tokenize, type Template } from "@huggingface/jinja";
import { items, pyStr, type PyValue } from "./jinja-repr.js";
import { percentFormat, pyStrftime } from "./jinja-format.js";
import { usePythonStrMethods } from "./jinja-strings.js";
import { PYTHON_FILTERS, STRING_FILTERS, type FilterContext } from "./jinja-filters.js";

/** A parsed chat template. */
export type TemplateProgram = Template["parsed"];
/** A token of the library's lexer (its lexer module's types do not resolve under NodeNext). */
interface Token {
  type: string;
  value: string;
}
type ValueClass = new (value?: unknown) => PyValue;
interface Node {
  type: string;
  [field: string]: unknown;
}
interface Binary extends Node {
  operator: Token;
  left: Node;
  right: Node;
}
/** The Interpreter's methods replaced here (private in the library's types). */
interface Internals {
  evaluate(node: Node | undefined, env: Environment): PyValue;
  evaluateBinaryExpression(node: Binary, env: Environment): PyValue;
  evaluateBlock(statements: Node[], env: Environment): PyValue;
  applyFilter(operand: PyValue, filter: Node, env: Environment): PyValue;
  evaluateArguments(args: Node[], env: Environment): [PyValue[], Map<string, PyValue>];
}

const COMPARISONS = new Set(["==", "!=", "<", ">", "<=", ">=", "in", "not in"]);
const isComparison = (n: unknown): n is Binary =>
  (n as Node | null)?.type === "BinaryExpression" && COMPARISONS.has((n as Binary).operator.value);

/** Comparisons that continue a Python chain (`a < b < c`): the library's tree reads them as `(a < b) < c`. */
const chains = new WeakSet<Node>();

/** Whether `tokens` close no parenthesis they did not open and leave none open. */
function balanced(tokens: Token[]): boolean {
  let depth = 0;
  for (const t of tokens) {
    depth += t.type === "OpenParen" ? 1 : t.type === "CloseParen" ? -1 : 0;
    if (depth < 0) return false;
  }
  return depth === 0;
}

/**
 * Marks the chained comparisons under `node`: a comparison whose left side is a comparison that no parenthesis closes
 * before its operator (the tokens between the two operators are balanced), so `(a == b) != (c == d)` stays a
 * comparison of bools. A `not in` (a token the parser makes, absent from `position`) never continues a chain.
 */
function markChains(node: unknown, position: Map<Token, number>, tokens: Token[]): void {
  if (Array.isArray(node)) for (const x of node) markChains(x, position, tokens);
  else if (node instanceof Map) for (const [k, x] of node) [k, x].forEach((y) => markChains(y, position, tokens));
  else if (typeof node === "object" && node !== null && typeof (node as Node).type === "string") {
    if (isComparison(node) && isComparison(node.left)) {
      const from = position.get(node.left.operator);
      const to = position.get(node.operator);
      if (from !== undefined && to !== undefined && balanced(tokens.slice(from + 1, to))) chains.add(node);
    }
    for (const x of Object.values(node)) markChains(x, position, tokens);
  }
}

/** Words after which `(` opens an expression, not a call's arguments. */
const KEYWORDS = new Set(["and", "or", "not", "in", "is", "if", "elif", "else", "for", "return"]);
/** Stands for nothing after the comma of a one-element tuple `(x,)`, which the library's parser refuses. */
const LONE = "__kiln_one_element_tuple__";

/**
 * Jinja2's literals that the library's lexer splits: `1e-5` / `2.5E3` (floats: it reads `1`, `e`, `-`, `5`) and the
 * one-element tuple `(x,)`, whose trailing comma gets a placeholder element that dropTupleMarks removes.
 */
function pythonLiterals(tokens: Token[]): Token[] {
  const out: Token[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i]!;
    const [next, sign, power] = [tokens[i + 1], tokens[i + 2], tokens[i + 3]];
    if (t.type === "NumericLiteral" && next?.type === "Identifier" && /^\d+(\.\d+)?$/.test(t.value.replace(/^[-+]/, ""))) {
      const mantissa = t.value.includes(".") ? t.value : `${t.value}.0`; // the parser reads a literal with a "." as a float
      if (/^[eE]\d+$/.test(next.value)) {
        out.push({ type: t.type, value: `${mantissa}e${next.value.slice(1)}` });
        i += 1;
        continue;
      }
      if (/^[eE]$/.test(next.value) && sign?.type === "AdditiveBinaryOperator" && power?.type === "NumericLiteral" && /^\d+$/.test(power.value)) {
        out.push({ type: t.type, value: `${mantissa}e${sign.value}${power.value}` });
        i += 3;
        continue;
      }
    }
    out.push(t);
    if (t.type === "Comma" && next?.type === "CloseParen" && !isCallParen(tokens, i)) out.push({ type: "Identifier", value: LONE });
  }
  return out;
}

/** Whether the parenthesis that the `)` after tokens[comma] closes holds a call's arguments. */
function isCallParen(tokens: Token[], comma: number): boolean {
  let depth = 0;
  for (let i = comma; i >= 0; i--) {
    const type = tokens[i]!.type;
    depth += type === "CloseParen" ? 1 : type === "OpenParen" ? -1 : 0;
    if (depth < 0) {
      const before = tokens[i - 1];
      if (before === undefined) return false;
      if (before.type === "Identifier") return !KEYWORDS.has(before.value);
      return before.type === "CloseParen" || before.type === "CloseSquareBracket" || before.type === "StringLiteral";
    }
  }
  return false;
}

/** Removes the placeholder element of one-element tuples (pythonLiterals). */
function dropTupleMarks(node: unknown): void {
  if (Array.isArray(node)) node.forEach(dropTupleMarks);
  else if (node instanceof Map) for (const [k, x] of node) [k, x].forEach(dropTupleMarks);
  else if (typeof node === "object" && node !== null && typeof (node as Node).type === "string") {
    const n = node as Node;
    if (n.type === "TupleLiteral" && Array.isArray(n.value) && (n.value.at(-1) as Node | undefined)?.value === LONE) n.value.pop();
    Object.values(n).forEach(dropTupleMarks);
  }
}

/** Parses a chat template with transformers' trim_blocks and lstrip_blocks, marking its chained comparisons. */
export function compileTemplate(source: string): TemplateProgram {
  const tokens = pythonLiterals(tokenize(source, { lstrip_blocks: true, trim_blocks: true }) as Token[]);
  const program = parse(tokens as Parameters<typeof parse>[0]);
  dropTupleMarks(program);
  markChains(program, new Map(tokens.map((t, i) => [t, i])), tokens);
  return program;
}

/** A node that evaluates to a value already evaluated (so that an operand is evaluated once). */
const CARRIED = "PyCarriedValue";
const carry = (value: PyValue): Node => ({ type: CARRIED, value });

/** Statements whose null result writes nothing ({% set %}, {% macro %}, comments); an expression's None prints. */
const SILENT = new Set(["Set", "Macro", "Comment"]);

let valuesInstalled = false;

/** Gives the Jinja runtime Python's printing, `~`, `%` on strings, chained comparisons, |string and |join. */
function usePythonValues(): void {
  if (valuesInstalled) return;
  valuesInstalled = true;
  const env = new Environment();
  const sample = (name: string, v: unknown) => env.set(name, v) as unknown as PyValue;
  const classOf = (v: PyValue) => v.constructor as ValueClass;
  const interpreter = Interpreter.prototype as unknown as Internals;
  const namespace = env.lookupVariable("namespace") as unknown as { value: (args: PyValue[], env: Environment) => PyValue };
  const tuple = interpreter.evaluate.call(new Interpreter(env), parse(tokenize("{{ (1, 2) }}")).body[0] as unknown as Node, env);
  const Str = classOf(sample("s", ""));
  const List = classOf(sample("l", []));
  const [Int, Float, Undefined] = [sample("int", 1), sample("float", 1.5), env.lookupVariable("no_such_name") as unknown as PyValue].map(classOf);
  for (const printed of [List, ...[sample("b", true), sample("n", null), sample("f", 1.5), sample("d", {}), namespace.value([], env), tuple].map(classOf)]) {
    (printed.prototype as { toString(): string }).toString = function (this: PyValue) {
      return pyStr(this);
    };
  }

  const { evaluate, evaluateBinaryExpression, applyFilter } = interpreter;
  interpreter.evaluate = function (this: Internals, node, scope) {
    return node?.type === CARRIED ? (node.value as PyValue) : evaluate.call(this, node, scope);
  };
  interpreter.evaluateBinaryExpression = function (this: Internals, node, scope) {
    if (chains.has(node)) return evaluateChain.call(this, node, scope);
    const op = node.operator.value;
    if (op !== "~" && op !== "%" && op !== "*") return evaluateBinaryExpression.call(this, node, scope);
    const left = this.evaluate(node.left, scope);
    const right = this.evaluate(node.right, scope);
    if (op === "~") return new Str(pyStr(left) + pyStr(right));
    if (op === "*") {
      const repeated = repeat(left, right) ?? repeat(right, left);
      if (repeated !== undefined) return repeated;
    }
    if (op === "%" && left.type === "StringValue") return new Str(percentFormat(left.value as string, right));
    return evaluateBinaryExpression.call(this, { ...node, left: carry(left), right: carry(right) }, scope);
  };
  /** Python's `seq * n`: a str, list or tuple repeated n times (none for n <= 0); undefined for other operands. */
  function repeat(seq: PyValue, n: PyValue): PyValue | undefined {
    if (n.type !== "IntegerValue" && n.type !== "BooleanValue") return undefined;
    const times = Math.max(0, Number(n.value));
    if (seq.type === "StringValue") return new Str((seq.value as string).repeat(times));
    if (seq.type !== "ArrayValue" && seq.type !== "TupleValue") return undefined;
    const out = Array.from({ length: times }, () => items(seq)).flat();
    return seq.type === "TupleValue" ? new (classOf(seq))(out) : new List(out);
  }
  /** Python's `a < b < c`: each operand evaluated once, the comparisons and-ed, False at the first that fails. */
  function evaluateChain(this: Internals, node: Binary, scope: Environment): PyValue {
    const operators: Token[] = [];
    const operands: Node[] = [];
    let first = node;
    for (; chains.has(first); first = first.left as Binary) {
      operators.unshift(first.operator);
      operands.unshift(first.right);
    }
    operators.unshift(first.operator);
    operands.unshift(first.left, first.right);
    let left = this.evaluate(operands[0], scope);
    let result = left;
    for (const [i, operator] of operators.entries()) {
      const right = this.evaluate(operands[i + 1], scope);
      result = evaluateBinaryExpression.call(this, { type: "BinaryExpression", operator, left: carry(left), right: carry(right) }, scope);
      if (result.value !== true) return result;
      left = right;
    }
    return result;
  }
  interpreter.evaluateBlock = function (this: Internals, statements, scope) {
    let out = "";
    for (const statement of statements) {
      const v = this.evaluate(statement, scope);
      if (v.type !== "UndefinedValue" && !(v.type === "NullValue" && SILENT.has(statement.type))) out += pyStr(v);
    }
    return new Str(out);
  };
  /** The runtime's values and operations for jinja-filters.ts, in `scope`. */
  const contextOf = (interp: Internals, scope: Environment): FilterContext => ({
    str: (s) => new Str(s),
    int: (n) => new Int(n),
    float: (x) => new Float(x),
    list: (xs) => new List(xs),
    undefined: () => new Undefined(),
    truthy: (v) => (v as unknown as { __bool__(): PyValue }).__bool__().value === true,
    filter: (value, name, args, kwargs) => {
      const callee = { type: "Identifier", value: name };
      const keywords = [...kwargs].map(([key, v]) => ({ type: "KeywordArgumentExpression", key: { type: "Identifier", value: key }, value: carry(v) }));
      const node = args.length + kwargs.size === 0 ? callee : { type: "CallExpression", callee, args: [...args.map(carry), ...keywords] };
      return interp.applyFilter(value, node, scope);
    },
    test: (value, name, args) => {
      const operator = TEST_OPERATORS.get(name);
      if (operator !== undefined) {
        const node = { type: "BinaryExpression", operator: { type: "ComparisonBinaryOperator", value: operator }, left: carry(value), right: carry(args[0]!) };
        return interp.evaluateBinaryExpression(node, scope).value === true;
      }
      const test = (scope as unknown as { tests: Map<string, (...v: PyValue[]) => boolean> }).tests.get(name);
      if (test === undefined) throw new Error(`No test named '${name}'`);
      return test(value, ...args);
    },
  });
  interpreter.applyFilter = function (this: Internals, operand, filter, scope) {
    const name = filter.type === "Identifier" ? filter.value : (filter.callee as Node | undefined)?.value;
    if (name === "string") return new Str(pyStr(operand));
    const own = typeof name === "string" ? (PYTHON_FILTERS.get(name) ?? (operand.type === "StringValue" ? STRING_FILTERS.get(name) : undefined)) : undefined;
    if (own !== undefined) {
      const [args, kwargs] = filter.type === "CallExpression" ? this.evaluateArguments(filter.args as Node[], scope) : [[], new Map<string, PyValue>()];
      const out = own(operand, args, kwargs, contextOf(this, scope));
      if (out !== undefined) return out;
    }
    const list = operand.type === "ArrayValue" || operand.type === "TupleValue";
    return applyFilter.call(this, name === "join" && list ? new List(items(operand).map((x) => new Str(pyStr(x)))) : operand, filter, scope);
  };
}

/** Jinja2's comparison tests (`x is gt 2`, select('gt', 2)) as their operators. */
const TEST_OPERATORS = new Map([
  ...["eq", "equalto", "=="].map((t) => [t, "=="] as const),
  ...["ne", "!="].map((t) => [t, "!="] as const),
  ...["lt", "lessthan", "<"].map((t) => [t, "<"] as const),
  ...["le", "<="].map((t) => [t, "<="] as const),
  ...["gt", "greaterthan", ">"].map((t) => [t, ">"] as const),
  ...["ge", ">="].map((t) => [t, ">="] as const),
  ["in", "in"] as const,
]);

/** Python's range(stop) / range(start, stop[, step]). */
function range(start: number, stop?: number, step = 1): number[] {
  if (stop === undefined) [start, stop] = [0, start];
  if (step === 0) throw new Error("range() arg 3 must not be zero");
  const out: number[] = [];
  for (let i = start; step > 0 ? i < stop : i > stop; i += step) out.push(i);
  return out;
}

/** Jinja2's literals and range, with transformers' raise_exception and strftime_now. */
const GLOBALS: Record<string, unknown> = {
  true: true,
  false: false,
  none: null,
  True: true,
  False: false,
  None: null,
  range,
  raise_exception: (message: unknown) => {
    throw new Error(String(message));
  },
  strftime_now: (format: string) => pyStrftime(new Date(), format),
};

/** Renders a compiled template with `vars` over the globals (a variable of the same name hides a global). */
export function renderTemplate(program: TemplateProgram, vars: Record<string, unknown>): string {
  usePythonValues();
  usePythonStrMethods();
  const globals = new Environment();
  for (const [name, value] of Object.entries(GLOBALS)) globals.set(name, value);
  const env = new Environment(globals);
  for (const [name, value] of Object.entries(vars)) env.set(name, value);
  return (new Interpreter(env).run(program) as unknown as PyValue).value as string;
}
