// Chat templates rendered with Python's Jinja2 semantics where @huggingface/jinja follows JavaScript's, as
// transformers (and so vLLM) renders them: `{{ true }}` prints True, `{{ none }}` None, a list or dict its repr;
// `~`, |string and |join take str() of any value; the globals are Jinja2's and transformers' (strftime_now as
// Python's strftime). The library exports its Interpreter but not its value classes:
// those are reached through values an Environment converts, and the methods replaced once per process.
import { Environment, Interpreter, parse, tokenize, type Template } from "@huggingface/jinja";
import { items, pyStr, type PyValue } from "./jinja-repr.js";
import { pyStrftime } from "./jinja-format.js";
import { usePythonStrip } from "./jinja-strings.js";

/** A parsed chat template. */
export type TemplateProgram = Template["parsed"];
type ValueClass = new (value?: unknown) => PyValue;
interface Node {
  type: string;
  [field: string]: unknown;
}
/** The Interpreter's methods replaced here (private in the library's types). */
interface Internals {
  evaluate(node: Node | undefined, env: Environment): PyValue;
  evaluateBinaryExpression(node: Node & { operator: { value: string }; left: Node; right: Node }, env: Environment): PyValue;
  evaluateBlock(statements: Node[], env: Environment): PyValue;
  applyFilter(operand: PyValue, filter: Node, env: Environment): PyValue;
}

/** Parses a chat template with transformers' trim_blocks and lstrip_blocks. */
export function compileTemplate(source: string): TemplateProgram {
  return parse(tokenize(source, { lstrip_blocks: true, trim_blocks: true }));
}

/** Statements whose null result writes nothing ({% set %}, {% macro %}, comments); an expression's None prints. */
const SILENT = new Set(["Set", "Macro", "Comment"]);

let valuesInstalled = false;

/** Gives the Jinja runtime Python's printing, `~`, |string and |join. */
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
  for (const printed of [List, ...[sample("b", true), sample("n", null), sample("f", 1.5), sample("d", {}), namespace.value([], env), tuple].map(classOf)]) {
    (printed.prototype as { toString(): string }).toString = function (this: PyValue) {
      return pyStr(this);
    };
  }

  const { evaluateBinaryExpression, applyFilter } = interpreter;
  interpreter.evaluateBinaryExpression = function (this: Internals, node, scope) {
    if (node.operator.value !== "~") return evaluateBinaryExpression.call(this, node, scope);
    return new Str(pyStr(this.evaluate(node.left, scope)) + pyStr(this.evaluate(node.right, scope)));
  };
  interpreter.evaluateBlock = function (this: Internals, statements, scope) {
    let out = "";
    for (const statement of statements) {
      const v = this.evaluate(statement, scope);
      if (v.type !== "UndefinedValue" && !(v.type === "NullValue" && SILENT.has(statement.type))) out += pyStr(v);
    }
    return new Str(out);
  };
  interpreter.applyFilter = function (this: Internals, operand, filter, scope) {
    const name = filter.type === "Identifier" ? filter.value : (filter.callee as Node | undefined)?.value;
    if (name === "string") return new Str(pyStr(operand));
    const list = operand.type === "ArrayValue" || operand.type === "TupleValue";
    return applyFilter.call(this, name === "join" && list ? new List(items(operand).map((x) => new Str(pyStr(x)))) : operand, filter, scope);
  };
}

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
  usePythonStrip();
  const globals = new Environment();
  for (const [name, value] of Object.entries(GLOBALS)) globals.set(name, value);
  const env = new Environment(globals);
  for (const [name, value] of Object.entries(vars)) env.set(name, value);
  return (new Interpreter(env).run(program) as unknown as PyValue).value as string;
}
