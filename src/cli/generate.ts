// `kiln generate` (one completion) and `kiln chat` (interactive REPL with history), straight on the engine.
import { randomUUID } from "node:crypto";
import { createInterface } from "node:readline/promises";
import { EngineInputError } from "../engine/errors.js";
import type { SamplingParams } from "../engine/types.js";
import type { ChatMessage } from "../models/tokenizer-types.js";
import type { EngineFactory, LoadedEngine } from "./engine-factory.js";
import { createProgress } from "./progress.js";
import type { ServeArgs } from "./serve-args.js";

export interface GenerateOptions {
  prompt: string;
  /** Unset: the generation config's (LoadedEngine.generationDefaults), else CLI_SAMPLING_DEFAULTS'. */
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  seed: number | null;
  stream: boolean;
  chat: boolean;
}

/** Builds the engine through the factory with the start-up progress shown. */
export async function loadEngine(args: ServeArgs, factory: EngineFactory): Promise<LoadedEngine> {
  const progress = createProgress();
  const loaded = await factory(args, progress);
  progress.done();
  return loaded;
}

/** Runs one request and writes its text (as it streams, when `stream`); returns the full text. */
async function complete(
  loaded: LoadedEngine, promptText: string, params: Partial<SamplingParams>, write: ((s: string) => void) | null, templated: boolean,
): Promise<string> {
  // A chat template already spells out BOS and friends.
  const ids = loaded.tokenizer.encode(promptText, { addSpecialTokens: !templated });
  let text = "";
  for await (const out of loaded.engine.generate({ promptTokenIds: ids, prompt: promptText }, params, { requestId: randomUUID(), delta: true })) {
    const delta = out.outputs[0]?.text ?? "";
    text += delta;
    if (write && delta) write(delta);
  }
  return text;
}

/** What generate and chat sample with when neither their flags nor the model's generation config say. */
export const CLI_SAMPLING_DEFAULTS = { maxTokens: 256, temperature: 0.7, topP: 1 } as const;

/** The flags given over the model's generation config (as `kiln serve` applies it) over CLI_SAMPLING_DEFAULTS. */
function paramsOf(loaded: LoadedEngine, o: Pick<GenerateOptions, "maxTokens" | "temperature" | "topP" | "seed">): Partial<SamplingParams> {
  const flags = { maxTokens: o.maxTokens, temperature: o.temperature, topP: o.topP, seed: o.seed ?? undefined };
  const given = Object.fromEntries(Object.entries(flags).filter(([, v]) => v !== undefined));
  return { ...CLI_SAMPLING_DEFAULTS, ...loaded.generationDefaults, ...given };
}

export async function runGenerate(args: ServeArgs, o: GenerateOptions, factory: EngineFactory, out: NodeJS.WritableStream = process.stdout): Promise<void> {
  const loaded = await loadEngine(args, factory);
  try {
    const prompt = o.chat
      ? loaded.tokenizer.applyChatTemplate([{ role: "user", content: o.prompt }], {
          addGenerationPrompt: true, ...(args.chatTemplate ? { chatTemplate: args.chatTemplate } : {}),
        })
      : o.prompt;
    const text = await complete(loaded, prompt, paramsOf(loaded, o), o.stream ? (s) => out.write(s) : null, o.chat);
    out.write(o.stream ? "\n" : `${text}\n`);
  } finally {
    await loaded.close();
  }
}

export async function runChat(
  args: ServeArgs, o: Omit<GenerateOptions, "prompt" | "chat" | "stream"> & { system: string | null; quick?: string | null }, factory: EngineFactory,
): Promise<void> {
  const loaded = await loadEngine(args, factory);
  const history: ChatMessage[] = o.system ? [{ role: "system", content: o.system }] : [];
  const reply = async (message: string): Promise<void> => {
    history.push({ role: "user", content: message });
    const prompt = loaded.tokenizer.applyChatTemplate(history, {
      addGenerationPrompt: true, ...(args.chatTemplate ? { chatTemplate: args.chatTemplate } : {}),
    });
    const text = await complete(loaded, prompt, paramsOf(loaded, o), (s) => process.stdout.write(s), true);
    process.stdout.write("\n");
    history.push({ role: "assistant", content: text });
  };
  // A message the engine refuses (too long for the model with the history) is said and dropped: the session goes on.
  const replyOrRefuse = async (message: string): Promise<void> => {
    try {
      await reply(message);
    } catch (e) {
      if (!(e instanceof EngineInputError)) throw e;
      history.pop();
      process.stderr.write(`kiln: error: ${e.message}\n`);
    }
  };
  if (o.quick != null) {
    try {
      return await reply(o.quick);
    } finally {
      await loaded.close();
    }
  }
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: Boolean(process.stdin.isTTY) });
  rl.on("SIGINT", () => rl.close()); // Ctrl-C at the prompt quits, as Ctrl-D (end of input) does
  process.stdout.write("Kiln chat: type a message; /reset clears the history, /exit (or Ctrl-D) quits.\n");
  rl.setPrompt("> ");
  try {
    rl.prompt();
    // Line by line until the input ends: piped lines arriving while a reply generates wait their turn.
    for await (const line of rl) {
      const input = line.trim();
      if (input === "/exit" || input === "/quit") break;
      if (input === "/reset") history.length = o.system ? 1 : 0;
      else if (input) await replyOrRefuse(input);
      rl.prompt();
    }
    process.stdout.write("\n");
  } finally {
    rl.close();
    await loaded.close();
  }
}
