// Chat fine-tuning: conversations from JSONL rendered with the model's template, the loss on assistant turns only,
// and a LoRA trained that way answering as its data does.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { LLM } from "../../src/engine/llm-engine.js";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { chatDocument, readJsonlDataset } from "../../src/train/chat-sft.js";
import { DataLoader, MASKED_TARGET, tokenizeDocuments } from "../../src/train/data-loader.js";
import { runRecipe } from "../../src/train/recipe.js";
import { parseTrainConfig } from "../../src/train/train-config.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/train -> package root
const KILN_DEFAULT = path.join(root, "models", "kiln-default");
const tok = Tokenizer.fromDir(KILN_DEFAULT);
const FRANCE = [
  { role: "system", content: "You answer briefly." },
  { role: "user", content: "What is the capital of France?" },
  { role: "assistant", content: "Paris is the capital of France." },
] as const;
const COLORS = [
  { role: "user", content: "Name a color." }, { role: "assistant", content: "Blue." },
  { role: "user", content: "Another one?" }, { role: "assistant", content: "Green." },
] as const;

test("a conversation's segments: the template's prompts untrained, each assistant turn (with its end marker) trained", () => {
  // kiln-default's ChatML template, written out by hand
  assert.deepEqual(chatDocument([...COLORS], tok, "t"), [
    { text: "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n", train: false },
    { text: "Blue.<|im_end|>\n", train: true },
    { text: "<|im_start|>user\nAnother one?<|im_end|>\n<|im_start|>assistant\n", train: false },
    { text: "Green.<|im_end|>\n", train: true },
  ]);
  const noAssistant = [{ role: "user", content: "hi" }] as const;
  assert.throws(() => chatDocument([...noAssistant], tok, "here"), /here: the conversation has no assistant message to train on/);
  // a template that does not render growing prefixes (it drops the earlier turns) cannot be split into turns
  const lastOnly = { applyChatTemplate: (ms: readonly { content: string | null }[]) => `[${ms.at(-1)?.content ?? ""}]` };
  assert.throws(() => chatDocument([...COLORS], lastOnly, "x"), /does not render this conversation as growing prefixes \(assistant turn 1\)/);
});

test("packed with the prompts masked: the loader's targets skip them, its inputs keep every token", () => {
  const docs = [chatDocument([...FRANCE], tok, "t"), "plain text"];
  const eos = tok.tokenToId("<|endoftext|>")!;
  const stream = tokenizeDocuments(docs, tok, eos);
  const prompt = tok.encode("<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n", { addSpecialTokens: false });
  const reply = tok.encode("Paris is the capital of France.<|im_end|>\n", { addSpecialTokens: false });
  const plain = tok.encode("plain text");
  assert.deepEqual([...stream], [...prompt.map((id) => -id - 1), ...reply, -eos - 1, ...plain, eos]);
  const n = stream.length - 1;
  const { inputs, targets } = new DataLoader(stream, { batchSize: 1, seqLen: n, shuffle: false }).next();
  assert.deepEqual([...inputs], [...prompt, ...reply, eos, ...plain]);
  // a target is trained where the token it predicts is: the reply (after the prompt's last token), then the plain text
  const want = [...prompt.slice(1).map(() => MASKED_TARGET), ...reply, MASKED_TARGET, ...plain, eos];
  assert.deepEqual([...targets], want);
});

test("JSONL datasets: conversations and texts; refusals name the line", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-sft-"));
  try {
    const file = path.join(dir, "d.jsonl");
    fs.writeFileSync(file, `${JSON.stringify({ messages: FRANCE })}\n\n${JSON.stringify({ text: "a plain document" })}\n`);
    const docs = readJsonlDataset(file, tok);
    assert.equal(docs.length, 2);
    assert.equal(docs[1], "a plain document");
    assert.throws(() => readJsonlDataset(file, null), /line 1: conversations fine-tune a model with a chat template: set \[checkpoint\] initial_load_path/);
    fs.writeFileSync(file, `${JSON.stringify({ text: "ok" })}\n{"messages": [{"role": "user"}]}\n`);
    assert.throws(() => readJsonlDataset(file, tok), /line 2: messages\[0\] needs a string "role" and "content"/);
    fs.writeFileSync(file, "not json\n");
    assert.throws(() => readJsonlDataset(file, tok), /line 1: not JSON/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("a LoRA trained on conversations answers them as its data does; the base model does not", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-sft-"));
  try {
    const data = path.join(dir, "chat.jsonl");
    fs.writeFileSync(data, Array.from({ length: 20 }, () => `${JSON.stringify({ messages: FRANCE })}\n${JSON.stringify({ messages: COLORS })}\n`).join(""));
    const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, "run")}"
seed = 1
[checkpoint]
initial_load_path = "${KILN_DEFAULT}"
initial_load_in_hf = true
[lora]
enable = true
rank = 8
target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
[optimizer]
lr = 5e-3
weight_decay = 0.0
[lr_scheduler]
warmup_steps = 2
[training]
local_batch_size = 4
seq_len = 64
steps = 30
dataset = "${data}"
[validation]
enable = false
`);
    const r = await runRecipe(cfg, { log: () => undefined, resume: false });
    const llm = new LLM({ model: KILN_DEFAULT, maxModelLen: 256, enforceEager: true, enableLora: true, maxLoraRank: 8 });
    const ask = (messages: readonly { role: string; content: string }[], lora: boolean) =>
      llm.chat([...messages] as never, { temperature: 0, maxTokens: 12 }, {}, lora ? { loraRequest: { name: "sft", id: 1, path: r.exportDir } } : {})[0]!.outputs[0]!.text;
    assert.equal(ask(FRANCE.slice(0, 2), true), "Paris is the capital of France.");
    assert.equal(ask(COLORS.slice(0, 1), true), "Blue.");
    assert.notEqual(ask(FRANCE.slice(0, 2), false), "Paris is the capital of France.");
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
