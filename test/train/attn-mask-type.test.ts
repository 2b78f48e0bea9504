// TorchTitan's [model] attn_mask_type in `kiln train`: "causal" (default) or "block_causal" (packed documents
// attend within themselves), from the TOML, the --section.key command line and TorchTitan's flex/varlen flavors; a
// recipe run under each; and chat fine-tuning's packed conversations kept apart.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { torchtitanArgs } from "../../src/cli/train-commands.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { noGrad } from "../../src/tensor/index.js";
import { chatDocument } from "../../src/train/chat-sft.js";
import { loadCorpus } from "../../src/train/corpus.js";
import { DataLoader, MASKED_TARGET, tokenizeDocuments } from "../../src/train/data-loader.js";
import { runRecipe } from "../../src/train/recipe.js";
import { parseTrainConfig } from "../../src/train/train-config.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/train -> package root
const KILN_DEFAULT = path.join(root, "models", "kiln-default");
const TINY = '[model]\nflavor = "tiny"\n';

test("[model] attn_mask_type: TOML, --model.attn_mask_type, TorchTitan's flex/varlen flavors; other values refused", () => {
  assert.equal(parseTrainConfig(TINY).model.attn_mask_type, "causal");
  assert.equal(parseTrainConfig(`${TINY}attn_mask_type = "block_causal"\n`).model.attn_mask_type, "block_causal");
  // TorchTitan's command line maps onto the TOML
  const { overrides } = torchtitanArgs(["--model.attn_mask_type", "block_causal"]);
  assert.equal(parseTrainConfig(TINY, overrides).model.attn_mask_type, "block_causal");
  assert.equal(parseTrainConfig(`${TINY}attn_mask_type = "block_causal"\n`, { "model.attn_mask_type": "causal" }).model.attn_mask_type, "causal");
  assert.throws(() => parseTrainConfig(`${TINY}attn_mask_type = "document"\n`), /\[model\] attn_mask_type: expected one of "causal", "block_causal", got "document"/);
  assert.throws(() => parseTrainConfig(TINY, torchtitanArgs(["--model.attn_mask_type=sliding"]).overrides), /expected one of "causal", "block_causal"/);
  // TorchTitan's debugmodel_flex_attn / _varlen_attn flavors pack documents apart unless the key says otherwise
  const flex = parseTrainConfig('[model]\nflavor = "debugmodel_flex_attn"\n');
  assert.equal(flex.model.attn_mask_type, "block_causal");
  assert.equal(flex.model.dim, 256);
  assert.equal(parseTrainConfig('[model]\nflavor = "debugmodel_flex_attn"\nattn_mask_type = "causal"\n').model.attn_mask_type, "causal");
  assert.equal(parseTrainConfig('[model]\nflavor = "debugmodel_varlen_attn"\n').model.attn_mask_type, "block_causal");
  // the kernel keys are accepted with a warning; varlen without block_causal is refused, as TorchTitan does
  const withFlex = parseTrainConfig(`${TINY}attn_type = "flex"\nattn_mask_type = "block_causal"\n`);
  assert.ok(withFlex.warnings.some((w) => w.includes("[model] attn_type flex")), withFlex.warnings.join("\n"));
  assert.ok(parseTrainConfig(`${TINY}use_flex_attn = true\n`).warnings.some((w) => w.includes("use_flex_attn")));
  assert.throws(() => parseTrainConfig(`${TINY}attn_type = "varlen"\n`), /attn_type varlen .* needs attn_mask_type = "block_causal"/);
  // fine-tuning names no model shape, but may pick the mask
  const ft = parseTrainConfig(`[model]\nattn_mask_type = "block_causal"\n[checkpoint]\ninitial_load_path = "${KILN_DEFAULT}"\ninitial_load_in_hf = true\n`);
  assert.equal(ft.model.attn_mask_type, "block_causal");
  assert.throws(
    () => parseTrainConfig(`[model]\ndim = 64\nattn_mask_type = "block_causal"\n[checkpoint]\ninitial_load_path = "${KILN_DEFAULT}"\ninitial_load_in_hf = true\n`),
    /\[model\] dim: the model's shape and tokenizer come from/,
  );
});

test("a short kiln train run under block_causal completes; its first-step loss differs from causal's on the same data", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-docmask-"));
  try {
    // one document per line ({"text": ...}): paragraphs, several to a 64-token row
    const corpus = path.join(dir, "corpus.jsonl");
    fs.writeFileSync(corpus, loadCorpus({ source: "brown", granularity: "paragraph", maxDocs: 60 }).map((text) => JSON.stringify({ text })).join("\n"));
    const run = async (mask: string) => {
      const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, mask)}"
seed = 3
[model]
dim = 32
n_layers = 1
n_heads = 2
ffn_dim = 64
tokenizer_vocab_size = 300
attn_mask_type = "${mask}"
[lr_scheduler]
warmup_steps = 1
[training]
local_batch_size = 2
seq_len = 64
steps = 2
dataset = "${corpus}"
[validation]
enable = true
fraction = 0.2
freq = 2
steps = 1
`);
      const logs: string[] = [];
      const losses: number[] = [];
      const r = await runRecipe(cfg, { log: (l) => logs.push(l), onStep: (m) => losses.push(m.loss), resume: false });
      return { r, logs, losses };
    };
    const causal = await run("causal");
    const block = await run("block_causal");
    assert.equal(block.losses.length, 2);
    assert.ok(block.losses.every(Number.isFinite) && block.r.valLoss !== null && Number.isFinite(block.r.valLoss), `${block.losses} ${block.r.valLoss} ${block.logs.join("\n")}`);
    assert.ok(block.logs.some((l) => /attn_mask_type block_causal: .*ended by token \d+\), positions restart per document$/.test(l)), block.logs.join("\n"));
    assert.ok(!causal.logs.some((l) => l.includes("attn_mask_type block_causal")));
    // same seed, tokenizer, data and initial weights: only the mask differs (seq_len 64 spans several paragraphs)
    assert.ok(Math.abs(causal.losses[0]! - block.losses[0]!) > 1e-4, `causal ${causal.losses[0]} vs block_causal ${block.losses[0]}`);
    assert.ok(fs.existsSync(path.join(block.r.exportDir, "model.safetensors")));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("chat SFT packed under block_causal: a row's assistant-only loss is its conversations' losses combined", () => {
  const { model, tokenizer: tok } = loadLocalModel(KILN_DEFAULT, { dtype: "float32" });
  const convs = [
    [{ role: "system", content: "You answer briefly." }, { role: "user", content: "What is the capital of France?" }, { role: "assistant", content: "Paris." }],
    [{ role: "user", content: "Name a color." }, { role: "assistant", content: "Blue." }, { role: "user", content: "Another one?" }, { role: "assistant", content: "Green." }],
    [{ role: "user", content: "Say hi." }, { role: "assistant", content: "Hi there!" }],
  ] as const;
  const eos = tok.tokenToId("<|endoftext|>")!;
  const stream = tokenizeDocuments(convs.map((c) => chatDocument([...c] as never, tok, "t")), tok, eos);
  const n = stream.length - 1;
  const { inputs, targets } = new DataLoader(stream, { batchSize: 1, seqLen: n, shuffle: false }).next();
  const loss = (i: Int32Array, t: Int32Array, sep: number | null) => noGrad(() => {
    const l = model.loss(i, t, 1, i.length, sep);
    const v = l.item();
    l.dispose();
    return v;
  });
  // each conversation alone from position 0: its inputs through its EOS (that EOS's target, the next one's first
  // token, is a masked prompt token)
  const ends = [...inputs.keys()].filter((i) => inputs[i] === eos).map((i) => i + 1);
  assert.equal(ends.length, 2, "the row holds three conversations, two EOS between them");
  let sum = 0;
  let count = 0;
  let start = 0;
  for (const end of [...ends, n]) {
    const t = targets.slice(start, end);
    const trained = t.filter((x) => x !== MASKED_TARGET).length;
    assert.ok(trained > 0);
    sum += trained * loss(inputs.slice(start, end), t, null);
    count += trained;
    start = end;
  }
  const packed = loss(inputs, targets, eos);
  assert.ok(Math.abs(packed - sum / count) < 1e-5 * Math.max(1, packed), `block_causal ${packed} vs conversations alone ${sum / count}`);
  const causal = loss(inputs, targets, null);
  assert.ok(Math.abs(causal - packed) > 1e-4, `causal ${causal} should differ from block_causal ${packed}`);
});

test("a block_causal fine-tuning run on chat JSONL says which token ends documents, and warns when one occurs inside", { timeout: 120_000 }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-docmask-sft-"));
  try {
    const data = path.join(dir, "chat.jsonl");
    const chat = { messages: [{ role: "user", content: "Name a color." }, { role: "assistant", content: "Blue." }] };
    // the text line holds the separator itself: block_causal splits that document there
    fs.writeFileSync(data, [...Array(6).fill(JSON.stringify(chat)), JSON.stringify({ text: "one part<|endoftext|>another part" })].join("\n"));
    const cfg = parseTrainConfig(`
[job]
dump_folder = "${path.join(dir, "run")}"
[model]
attn_mask_type = "block_causal"
[checkpoint]
initial_load_path = "${KILN_DEFAULT}"
initial_load_in_hf = true
[lora]
enable = true
[training]
local_batch_size = 1
seq_len = 32
steps = 1
dataset = "${data}"
[validation]
enable = false
`);
    const logs: string[] = [];
    const r = await runRecipe(cfg, { log: (l) => logs.push(l), resume: false });
    assert.ok(Number.isFinite(r.finalLoss));
    const eos = loadLocalModel(KILN_DEFAULT, { dtype: "float32" }).tokenizer.tokenToId("<|endoftext|>")!;
    assert.ok(logs.some((l) => l.includes(`ended by token ${eos}), positions restart per document; warning: token ${eos} also occurs 1 time(s) inside documents`)), logs.join("\n"));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
