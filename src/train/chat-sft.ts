// Chat fine-tuning data: JSONL files of OpenAI-style conversations ({"messages": [{"role", "content"}, ...]}, the
// format TRL and torchtune read) rendered with the model's own chat template, the loss on the assistant turns only
// (TRL's assistant_only_loss, torchtune's train_on_input = false). A line {"text": "..."} is a plain document.
// Each assistant turn's text is what the template adds between the conversation before it with the generation
// prompt and the conversation through it, so the template must render conversations as growing prefixes.
import * as fs from "node:fs";
import type { ChatMessage } from "../models/tokenizer-types.js";
import type { DocumentSegment, TrainingDocument } from "./data-loader.js";
import { TrainConfigError } from "./train-config.js";

/** What rendering needs of a tokenizer. */
export interface ChatRenderer {
  applyChatTemplate(messages: ChatMessage[], options: { addGenerationPrompt?: boolean }): string;
}

/** A conversation as segments: the prompts (system, user, tool turns and the template's markup) untrained, each assistant turn trained. */
export function chatDocument(messages: ChatMessage[], renderer: ChatRenderer, where: string): DocumentSegment[] {
  const segments: DocumentSegment[] = [];
  let before = "";
  messages.forEach((m, k) => {
    if (m.role !== "assistant") return;
    const prompt = renderer.applyChatTemplate(messages.slice(0, k), { addGenerationPrompt: true });
    const through = renderer.applyChatTemplate(messages.slice(0, k + 1), { addGenerationPrompt: false });
    if (!prompt.startsWith(before) || !through.startsWith(prompt))
      throw new TrainConfigError(`${where}: the chat template does not render this conversation as growing prefixes (assistant turn ${k}), so its turns cannot be told apart`);
    segments.push({ text: prompt.slice(before.length), train: false }, { text: through.slice(prompt.length), train: true });
    before = through;
  });
  if (segments.length === 0) throw new TrainConfigError(`${where}: the conversation has no assistant message to train on`);
  return segments;
}

/** A JSONL dataset file: conversations (rendered by `renderer`; null: none available) and plain texts. */
export function readJsonlDataset(file: string, renderer: ChatRenderer | null): TrainingDocument[] {
  const docs: TrainingDocument[] = [];
  fs.readFileSync(file, "utf8").split("\n").forEach((line, i) => {
    if (line.trim() === "") return;
    const where = `[training] dataset ${file}, line ${i + 1}`;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (e) {
      throw new TrainConfigError(`${where}: not JSON (${(e as Error).message})`);
    }
    const r = row as { messages?: unknown; text?: unknown } | null;
    if (typeof r?.text === "string") {
      docs.push(r.text);
      return;
    }
    if (!Array.isArray(r?.messages)) throw new TrainConfigError(`${where}: expected {"messages": [...]} or {"text": "..."}`);
    const messages = r.messages.map((m: unknown, j: number) => {
      const msg = m as { role?: unknown; content?: unknown } | null;
      if (typeof msg?.role !== "string" || typeof msg.content !== "string")
        throw new TrainConfigError(`${where}: messages[${j}] needs a string "role" and "content"`);
      return { role: msg.role, content: msg.content } as ChatMessage;
    });
    if (renderer === null)
      throw new TrainConfigError(`${where}: conversations fine-tune a model with a chat template: set [checkpoint] initial_load_path (and initial_load_in_hf = true)`);
    docs.push(chatDocument(messages, renderer, where));
  });
  return docs;
}
