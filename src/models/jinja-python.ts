// Chat templates rendered as transformers (and so vLLM) renders them, with Python's Jinja2 globals: Jinja2's
// literals and range, and transformers' raise_exception and strftime_now (Python's strftime, which Llama 3.x's
// template calls for today's date with %d %b %Y and others with %A or glibc's %-d). @huggingface/jinja's own
// strftime_now knows only %Y %m %d %b %B %H %M and names months in the machine's locale, and a render's variable of
// a global's name (chat_template_kwargs {"range": ...}) was refused as "already declared".
import { Environment, Interpreter, parse, tokenize, type Template } from "@huggingface/jinja";
import { pyStrftime } from "./jinja-format.js";
import { usePythonStrip } from "./jinja-strings.js";

/** A parsed chat template. */
export type TemplateProgram = Template["parsed"];

/** Parses a chat template with transformers' trim_blocks and lstrip_blocks. */
export function compileTemplate(source: string): TemplateProgram {
  return parse(tokenize(source, { lstrip_blocks: true, trim_blocks: true }));
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
  usePythonStrip(); // Python's str.strip(chars), which templates use and the library lacks
  const globals = new Environment();
  for (const [name, value] of Object.entries(GLOBALS)) globals.set(name, value);
  const env = new Environment(globals);
  for (const [name, value] of Object.entries(vars)) env.set(name, value);
  return new Interpreter(env).run(program).value as string;
}
