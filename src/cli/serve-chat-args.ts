// `kiln serve` flags for chat requests (vLLM's FrontendArgs chat fields): the chat template, how it sees content and
// its default arguments, the reply's role and tool calling.
import { existsSync, readFileSync, statSync } from "node:fs";
import { Option, type Command } from "commander";
import { CHAT_CONTENT_FORMATS, type ChatContentFormat } from "../models/chat-content-format.js";
import { toolCallParserNames } from "../server/tool-parsers.js";
import { jsonObjectFlag, oneOf } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

export interface ChatArgs {
  chatTemplate: string | null; // template text (read from the file when a path was given)
  /** vLLM --chat-template-content-format: message content as a string, OpenAI parts, or auto (from the template). */
  chatTemplateContentFormat: ChatContentFormat;
  /** vLLM --default-chat-template-kwargs: every chat render's template variables (a request's chat_template_kwargs win). */
  defaultChatTemplateKwargs: Record<string, unknown> | null;
  /** vLLM --trust-request-chat-template: requests may carry their own chat_template (else a 400). */
  trustRequestChatTemplate: boolean;
  /** vLLM --exclude-tools-when-tool-choice-none: tool_choice "none" renders the chat template without the request's tools. */
  excludeToolsWhenToolChoiceNone: boolean;
  /** vLLM --response-role: the chat reply's role when the request's add_generation_prompt is true. */
  responseRole: string;
  /** tool_choice "auto" parses tool calls out of the model's text with this parser (vLLM --tool-call-parser); null = refused. */
  toolCallParser: string | null;
}

/** Declares the chat flags on `cmd` (serve only: generate and chat declare their own --chat-template). */
export function addChatOptions(cmd: Command): Command {
  return cmd
    .option("--chat-template <file-or-template>", "chat template file or inline Jinja template")
    .addOption(
      new Option("--chat-template-content-format <format>", "message content as the template sees it: a string, OpenAI's list of parts, or auto (from the template)")
        .choices([...CHAT_CONTENT_FORMATS])
        .default("auto"),
    )
    .option("--trust-request-chat-template", "let requests bring their own chat_template (Jinja the server runs); without it they get a 400, as in vLLM", false)
    .option("--default-chat-template-kwargs <json>", 'template variables of every chat request, as JSON: {"enable_thinking": false} (a request\'s chat_template_kwargs win)')
    .option("--response-role <role>", "the chat reply's role when the request's add_generation_prompt is true", "assistant")
    .option("--exclude-tools-when-tool-choice-none", "a request with tool_choice \"none\" renders the chat template without its tools", false)
    .option("--enable-auto-tool-choice", "serve tool_choice \"auto\" by parsing tool calls out of the model's text (needs --tool-call-parser)", false)
    .option("--tool-call-parser <name>", `how tool calls are written in the model's text: ${toolCallParserNames().join(", ")}, or a --tool-parser-plugin's`)
    .option("--tool-parser-plugin <file>", "a JavaScript module (ESM) whose `toolParsers` export (or default export) maps parser names to {streamable, extract} objects");
}

/** Validates the chat flags. */
export function parseChatArgs(o: Record<string, unknown>): ChatArgs {
  const role = o.responseRole ?? "assistant";
  if (typeof role !== "string" || role.trim() === "") throw new CliUsageError(`--response-role must be a non-empty role name, got ${JSON.stringify(role)}`);
  // (a --tool-parser-plugin module is imported before the flags are parsed: its names are among the choices)
  const parser = o.toolCallParser === undefined ? null : oneOf(o.toolCallParser, "--tool-call-parser", toolCallParserNames());
  const enableAutoToolChoice = Boolean(o.enableAutoToolChoice);
  if (enableAutoToolChoice && parser === null) throw new CliUsageError("--enable-auto-tool-choice requires --tool-call-parser");
  return {
    chatTemplate: parseChatTemplate(o.chatTemplate),
    chatTemplateContentFormat: oneOf(o.chatTemplateContentFormat ?? "auto", "--chat-template-content-format", CHAT_CONTENT_FORMATS),
    defaultChatTemplateKwargs:
      o.defaultChatTemplateKwargs === undefined ? null : jsonObjectFlag(o.defaultChatTemplateKwargs, "--default-chat-template-kwargs", '{"enable_thinking": false}'),
    trustRequestChatTemplate: Boolean(o.trustRequestChatTemplate),
    excludeToolsWhenToolChoiceNone: Boolean(o.excludeToolsWhenToolChoiceNone),
    responseRole: role,
    toolCallParser: enableAutoToolChoice ? parser : null,
  };
}

/**
 * vLLM's rule: a file's contents; else the text itself when it looks like a template ({, } or a newline in it), its
 * backslash escapes decoded as vLLM decodes them (Python's unicode_escape: a typed `\n` is a newline).
 */
export function parseChatTemplate(t: unknown): string | null {
  if (typeof t !== "string") return null;
  if (existsSync(t) && statSync(t).isFile()) return readFileSync(t, "utf8");
  if (/[{}\n]/.test(t)) return decodeUnicodeEscapes(t);
  throw new CliUsageError(`--chat-template ${JSON.stringify(t)} looks like a file path, but it cannot be opened`);
}

const SIMPLE_ESCAPES: Record<string, string> = { "\n": "", "\\": "\\", "'": "'", '"': '"', a: "\x07", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t", v: "\v" };

/** Python's codecs.decode(text, "unicode_escape") for the escapes it knows (others stay as written); \N{...} is not read. */
function decodeUnicodeEscapes(text: string): string {
  return text.replace(/\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|[\s\S])/g, (escape, body: string) => {
    const simple = SIMPLE_ESCAPES[body];
    if (simple !== undefined) return simple;
    if (/^[0-7]/.test(body)) return String.fromCodePoint(parseInt(body, 8));
    if (body.length > 1) {
      const code = parseInt(body.slice(1), 16);
      if (code > 0x10ffff) throw new CliUsageError(`--chat-template: ${escape} is not a character`);
      return String.fromCodePoint(code);
    }
    if (body === "x" || body === "u" || body === "U") throw new CliUsageError(`--chat-template: a truncated \\${body} escape`);
    return escape;
  });
}
