// `kiln train --config FILE.toml`: the TorchTitan-style recipe. Loads text, trains (or loads) a byte-level BPE
// tokenizer, packs the corpus, builds a Llama-architecture model, trains it with [optimizer]'s optimizer (AdamW by
// default) + warmup/decay, logs loss / grad norm / tokens/s / MFU, validates, checkpoints and resumes, draws the loss
// curve, and exports a Hugging Face model directory that `kiln serve` loads.
import * as fs from "node:fs";
import * as path from "node:path";
import { CausalLM } from "../models/causal-lm.js";
import { parseHfConfig } from "../models/hf-config.js";
import { writeSafetensors, type SafetensorsWriteTensor } from "../models/formats/safetensors.js";
import { f32ToBf16, f32ToF16 } from "../models/formats/dtype-convert.js";
import { defaultDevice, manualSeed, noGrad, ones, opSacPolicy, randn, tensor, type Tensor } from "../tensor/index.js";
import { allReduce, barrier, destroyProcessGroup, getRank, getWorldSize, initProcessGroup, isInitialized, newGroup, type ProcessGroup } from "../distributed/index.js";
import { DistributedDataParallel } from "../nn/index.js";
import { env } from "../util/env.js";
import { ByteLevelBpe, saveTokenizer, trainBpeTokenizer } from "./bpe-trainer.js";
import { CorpusError, loadCorpus } from "./corpus.js";
import { buildDatasets, DataLoader, DataLoaderError, tokenizeDocuments, type TrainingDocument } from "./data-loader.js";
import { stepDirName } from "./checkpoint.js";
import { readJsonlDataset, type ChatRenderer } from "./chat-sft.js";
import { renderLossCurveSvg } from "./loss-curve.js";
import { buildOptimizer } from "./optimizer-config.js";
import { LrSchedule } from "./lr-schedule.js";
import { train, type DataParallelHooks, type StepMetrics } from "./trainer.js";
import { ZeroRedundancyOptimizer } from "./zero-redundancy-optimizer.js";
import { activationCheckpointLayers, opLevelActivationCheckpoint, TrainConfigError, type TrainConfig } from "./train-config.js";
import { documentSeparator, exportInitialModelFiles, loadInitialModel } from "./initial-load.js";
import { attachLoraAdapters, exportLoraAdapter, mergeAdapters, type TrainedLora } from "./lora-train.js";

export interface RecipeHooks {
  log?: (line: string) => void;
  /** Called after each step (progress bars). */
  onStep?: (m: StepMetrics & { mfu: number; valLoss?: number }, totalSteps: number) => void;
  /** Resume from the newest checkpoint under the checkpoint folder. */
  resume?: boolean;
  /** Peak FLOP/s of this machine (for MFU); measured by the caller, default 117 GFLOP/s per core. */
  peakFlops?: number;
}

export interface RecipeResult {
  exportDir: string;
  finalLoss: number;
  valLoss: number | null;
  valPerplexity: number | null;
  numParams: number;
  tokensPerSecond: number;
  mfu: number;
  seconds: number;
  /** This process's rank (0 outside a data-parallel run); only rank 0 writes files and logs. */
  rank: number;
  worldSize: number;
}

const SPECIAL_CHAT_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/**
 * "brown", "nlp-corpus", a path (text files; a .jsonl file of conversations or texts: chat-sft.ts), or several
 * joined with "+". `renderer`: the chat template conversations are rendered with (null: none, they are refused).
 */
function loadDataset(dataset: string, renderer: ChatRenderer | null, key: string): TrainingDocument[] {
  return dataset.split("+").flatMap((part): TrainingDocument[] => {
    if (part === "brown") return loadCorpus({ source: "brown", granularity: "paragraph" });
    if (part === "nlp-corpus") return loadCorpus({ source: part });
    if (!fs.existsSync(part)) throw new TrainConfigError(`${key} ${part} does not exist (brown, nlp-corpus, a text file or directory, or a .jsonl file)`);
    try {
      return part.endsWith(".jsonl") ? readJsonlDataset(part, renderer) : loadCorpus({ source: "files", paths: [part] });
    } catch (e) {
      // a directory without text files is the recipe's error, as a missing path is
      if (e instanceof CorpusError) throw new TrainConfigError(`${key} ${part}: ${e.message}`);
      throw e;
    }
  });
}

/**
 * Rewrites a deterministic share of documents as one ChatML exchange, so the model learns the chat format:
 * the user turn asks to continue the opening sentence(s), the assistant turn is the continuation.
 */
export function chatFormat<T extends TrainingDocument>(docs: T[], fraction: number, seed: number): (T | string)[] {
  if (fraction <= 0) return docs;
  let state = seed >>> 0 || 1;
  const rand = () => ((state = (Math.imul(state, 1664525) + 1013904223) >>> 0) / 4294967296);
  const prompts = ["Continue the text:", "Please continue:", "Write what comes next:", "Go on:"];
  return docs.map((doc) => {
    if (typeof doc !== "string" || rand() >= fraction) return doc; // (a conversation from a dataset keeps its own form)
    const sentences = doc.match(/[^.!?]+[.!?]+["')]*\s*/g);
    if (!sentences || sentences.length < 2) return doc;
    const cut = Math.max(1, Math.min(sentences.length - 1, 1 + Math.floor(rand() * 2)));
    const opening = sentences.slice(0, cut).join("").trim();
    const rest = sentences.slice(cut, cut + 4).join("").trim();
    const ask = prompts[Math.floor(rand() * prompts.length)]!;
    return `<|im_start|>user\n${ask} ${opening}<|im_end|>\n<|im_start|>assistant\n${rest}<|im_end|>\n`;
  });
}

/** HF config.json for the recipe's Llama model. */
export function recipeHfConfig(cfg: TrainConfig, vocabSize: number, eosId: number): Record<string, unknown> {
  const m = cfg.model;
  return {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    hidden_size: m.dim,
    intermediate_size: m.ffn_dim,
    num_hidden_layers: m.n_layers,
    num_attention_heads: m.n_heads,
    num_key_value_heads: m.n_kv_heads,
    vocab_size: vocabSize,
    max_position_embeddings: m.max_seq_len,
    rms_norm_eps: m.norm_eps,
    rope_theta: m.rope_theta,
    tie_word_embeddings: true,
    hidden_act: "silu",
    torch_dtype: cfg.checkpoint.export_dtype,
    eos_token_id: eosId,
    bos_token_id: null,
  };
}

/**
 * FLOPs per token as TorchTitan counts them: 6 * (non-embedding params) + 12 * layers * heads * head_dim * seq
 * (the attention score and value matmuls, forward + backward).
 */
export function flopsPerToken(model: CausalLM, seqLen: number): number {
  const c = model.config;
  const embed = c.vocabSize * c.hiddenSize;
  const nonEmbedding = model.numParameters() - (c.tieWordEmbeddings ? embed : 2 * embed) + embed; // the tied head still multiplies
  return 6 * nonEmbedding + 12 * c.numHiddenLayers * c.numAttentionHeads * c.headDim * seqLen;
}

function initWeights(model: CausalLM, seed: number, layers: number): void {
  manualSeed(seed);
  for (const [name, p] of model.namedParameters()) {
    // GPT-2/Llama-style init: N(0, 0.02); residual output projections scaled by 1/sqrt(2 * layers)
    const std = /o_proj|down_proj/.test(name) ? 0.02 / Math.sqrt(2 * layers) : 0.02;
    const t = name.endsWith("norm.weight") ? ones(p.shape) : randn(p.shape, { std });
    const cast = p.dtype === "float32" ? t : t.to(p.dtype);
    if (cast !== t) t.dispose();
    cast.requiresGrad = true;
    model.setParameter(name, cast);
  }
}

/** Writes config.json, the weights and (`tok`: the recipe's own tokenizer) the tokenizer and generation files. */
function exportModel(dir: string, model: CausalLM, hfConfig: Record<string, unknown>, tok: ByteLevelBpe | null, dtype: string): void {
  fs.mkdirSync(dir, { recursive: true });
  const tensors: SafetensorsWriteTensor[] = model.namedParameters().map(([name, p]) => {
    const f = (p.dtype === "float32" ? p : p.to("float32")).dataSync() as Float32Array;
    const keep32 = dtype === "float32" || name.endsWith("norm.weight");
    if (keep32) return { name, dtype: "F32", shape: [...p.shape], data: f };
    return dtype === "bfloat16" ? { name, dtype: "BF16", shape: [...p.shape], data: f32ToBf16(f) } : { name, dtype: "F16", shape: [...p.shape], data: f32ToF16(f) };
  });
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(hfConfig, null, 2) + "\n");
  writeSafetensors(path.join(dir, "model.safetensors"), tensors, { format: "pt" });
  if (tok === null) return; // (a fine-tuned model's are its directory's: exportInitialModelFiles)
  saveTokenizer(dir, tok, { eosToken: "<|im_end|>", padToken: "<|endoftext|>", bosToken: null, chatTemplate: SPECIAL_CHAT_TEMPLATE, modelMaxLength: Number(hfConfig.max_position_embeddings) });
  const eos = [tok.tokenToId("<|im_end|>"), tok.tokenToId("<|endoftext|>")].filter((x): x is number => x !== undefined);
  fs.writeFileSync(
    path.join(dir, "generation_config.json"),
    JSON.stringify({ eos_token_id: eos, temperature: 0.8, top_p: 0.95, top_k: 50, repetition_penalty: 1.1, max_new_tokens: 128 }, null, 2) + "\n",
  );
}

/**
 * TorchTitan's [parallelism] data-parallel degrees against the ranks `kiln run` started: replicate x shard must be the
 * world size (-1 in shard: what the replicas leave). Returns them resolved. Every rank holds the whole model and
 * gradients are averaged over the world (DDP); shard > 1 splits the optimizer state over each run of `shard`
 * consecutive ranks (ZeRO-1: ZeroRedundancyOptimizer), the replicas each holding a whole copy of it.
 */
function checkDataParallelDegrees(cfg: TrainConfig, worldSize: number): { replicate: number; shard: number } {
  const { data_parallel_replicate_degree: r, data_parallel_shard_degree: s } = cfg.parallelism;
  const total = s === -1 ? worldSize : r * s;
  if (total !== worldSize || worldSize % r !== 0)
    throw new TrainConfigError(`[parallelism] data_parallel_replicate_degree ${r} x data_parallel_shard_degree ${s} does not cover the ${worldSize} rank(s) this run has (kiln run --nproc-per-node N)`);
  return { replicate: r, shard: worldSize / r };
}

/**
 * The group this rank shares its optimizer state with: its run of `shard` consecutive ranks (TorchTitan's mesh puts
 * dp_shard innermost); every rank creates every group, in the same order, as torch's new_group asks. Undefined: the world.
 */
function shardGroup(replicate: number, shard: number, rank: number): ProcessGroup | undefined {
  if (replicate === 1) return undefined;
  const groups = Array.from({ length: replicate }, (_, k) => newGroup(Array.from({ length: shard }, (_, i) => k * shard + i)));
  return groups[Math.floor(rank / shard)];
}

/** What the run resumes from: the newest checkpoint, none (--no-resume), or [checkpoint] load_step's (which must exist). */
function resumeFrom(cfg: TrainConfig, dump: string, resume: boolean): boolean | string {
  if (!resume || cfg.checkpoint.load_step === -1) return resume;
  const dir = path.join(dump, cfg.checkpoint.folder, stepDirName(cfg.checkpoint.load_step));
  if (!fs.existsSync(path.join(dir, "state.json"))) throw new TrainConfigError(`[checkpoint] load_step ${cfg.checkpoint.load_step}: no checkpoint at ${dir}`);
  return dir;
}

/** The gradient accumulation steps: [training] global_batch_size's, where given, for this run's ranks. */
function accumulationSteps(cfg: TrainConfig, worldSize: number): number {
  const t = cfg.training;
  if (t.global_batch_size === -1) return t.gradient_accumulation_steps;
  const perStep = t.local_batch_size * worldSize;
  if (t.global_batch_size % perStep !== 0)
    throw new TrainConfigError(`[training] global_batch_size ${t.global_batch_size} is not a multiple of local_batch_size ${t.local_batch_size} x ${worldSize} rank(s)`);
  const steps = t.global_batch_size / perStep;
  if (t.gradient_accumulation_steps !== 1 && t.gradient_accumulation_steps !== steps)
    throw new TrainConfigError(`[training] gradient_accumulation_steps ${t.gradient_accumulation_steps} and global_batch_size ${t.global_batch_size} (${steps} steps of ${perStep}) disagree`);
  return steps;
}

/** Runs the whole recipe. */
/**
 * The tokenizer at [model] tokenizer_path, or a TrainConfigError before any data loads. The recipe encodes with
 * GPT-2's byte-level split (ByteLevelBpe) and exports ChatML special tokens, so a tokenizer with another
 * pre-tokenizer or a normalizer (Llama 3's, Qwen's) would be trained on other token ids than it is served with, and
 * one without those tokens could not be exported.
 */
function pretrainedTokenizer(cfg: TrainConfig): ByteLevelBpe {
  const tp = cfg.model.tokenizer_path!;
  const err = (msg: string): never => {
    throw new TrainConfigError(`[model] tokenizer_path ${tp}: ${msg}`);
  };
  if (!fs.existsSync(tp)) err("no such file or directory");
  const p = fs.statSync(tp).isDirectory() ? path.join(tp, "tokenizer.json") : tp;
  if (!fs.existsSync(p)) err("the directory has no tokenizer.json");
  let json: Record<string, unknown> = {};
  try {
    json = JSON.parse(fs.readFileSync(p, "utf8")) as Record<string, unknown>;
  } catch (e) {
    err(`not valid JSON (${(e as Error).message})`);
  }
  const pre = json.pre_tokenizer as Record<string, unknown> | null | undefined;
  const model = json.model as Record<string, unknown> | undefined;
  if (pre?.type !== "ByteLevel" || pre.use_regex === false || (json.normalizer ?? null) !== null || model?.ignore_merges === true) {
    err(`its pre-tokenizer ${JSON.stringify(pre ?? null).slice(0, 100)} (or normalizer) is not GPT-2's byte-level split, which training ` +
      "encodes with: the model would be served with other token ids than it was trained on; leave tokenizer_path unset to train one");
  }
  const tok = ByteLevelBpe.fromJson(json as unknown as Parameters<typeof ByteLevelBpe.fromJson>[0]);
  const needed = ["<|endoftext|>", "<|im_end|>", ...(cfg.training.chat_format_fraction > 0 ? ["<|im_start|>"] : [])];
  for (const t of needed) if (tok.tokenToId(t) === undefined) err(`it has no ${t} token, which the recipe's ChatML documents and export use`);
  if (cfg.model.vocab_size !== null && cfg.model.vocab_size < tok.vocabSize) {
    throw new TrainConfigError(`[model] vocab_size ${cfg.model.vocab_size} < the vocabulary of tokenizer_path (${tok.vocabSize})`);
  }
  return tok;
}

/**
 * Data parallelism under `kiln run --nproc-per-node N kiln train ...` (WORLD_SIZE > 1): joins the process group
 * (env://) unless the caller already did; returns null for a single process.
 */
function joinDataParallel(): { rank: number; worldSize: number; owned: boolean } | null {
  let owned = false;
  if (!isInitialized()) {
    if ((env.dist.worldSize ?? 1) <= 1) return null;
    initProcessGroup({ backend: "gloo" });
    owned = true;
  }
  return getWorldSize() > 1 ? { rank: getRank(), worldSize: getWorldSize(), owned } : null;
}

export async function runRecipe(cfg: TrainConfig, hooks: RecipeHooks = {}): Promise<RecipeResult> {
  const dist = joinDataParallel();
  const rank = dist?.rank ?? 0;
  const worldSize = dist?.worldSize ?? 1;
  try {
    return await runRecipeOnRank(cfg, rank === 0 ? hooks : { ...hooks, log: () => undefined, onStep: undefined }, rank, worldSize);
  } finally {
    if (dist?.owned) destroyProcessGroup();
  }
}

async function runRecipeOnRank(cfg: TrainConfig, hooks: RecipeHooks, rank: number, worldSize: number): Promise<RecipeResult> {
  const log = hooks.log ?? ((l: string) => console.log(l));
  const t0 = performance.now();
  const degrees = checkDataParallelDegrees(cfg, worldSize);
  const accumulation = accumulationSteps(cfg, worldSize);
  for (const w of cfg.warnings) log(`[config] ${w}`);
  if (cfg.job.print_args) log(`[config] ${JSON.stringify({ ...cfg, warnings: undefined })}`);
  const dump = cfg.job.dump_folder;
  // fine-tuning: the model, its shape and tokenizer from a Hugging Face directory (before any data loads)
  const init = cfg.checkpoint.initial_load_path !== null ? loadInitialModel(cfg) : null;
  const pretrained = cfg.model.tokenizer_path ? pretrainedTokenizer(cfg) : null;
  fs.mkdirSync(dump, { recursive: true });
  // data parallel: rank 0 trains the tokenizer and writes the token cache; the others wait, then read them
  if (rank > 0) barrier();

  // 1. data and tokenizer
  const docs = chatFormat(loadDataset(cfg.training.dataset, init?.tokenizer ?? null, "[training] dataset"), cfg.training.chat_format_fraction, cfg.job.seed);
  const texts = docs.map((d) => (typeof d === "string" ? d : d.map((seg) => seg.text).join("")));
  const chats = docs.length - docs.filter((d) => typeof d === "string").length;
  log(`[data] ${docs.length} documents${chats > 0 ? ` (${chats} conversations: loss on the assistant turns)` : ""}, ${texts.reduce((s, d) => s + d.length, 0)} characters from ${cfg.training.dataset}`);
  let tok: ByteLevelBpe | null = null;
  const tokDir = path.join(dump, "tokenizer");
  if (init !== null) {
    // (the ChatML rewrite needs ChatML's tokens in the model's vocabulary)
    const missing = cfg.training.chat_format_fraction > 0 ? ["<|im_start|>", "<|im_end|>"].filter((t) => init.tokenizer.tokenToId(t) === undefined) : [];
    if (missing.length > 0)
      throw new TrainConfigError(`[training] chat_format_fraction ${cfg.training.chat_format_fraction}: the tokenizer of ${init.dir} has no ${missing.join(" or ")} (set it to 0)`);
  } else if (pretrained) {
    tok = pretrained;
  } else if (fs.existsSync(path.join(tokDir, "tokenizer.json"))) {
    tok = ByteLevelBpe.fromJson(JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer.json"), "utf8")));
  } else {
    tok = trainBpeTokenizer(texts, { vocabSize: cfg.model.tokenizer_vocab_size, specialTokens: cfg.model.tokenizer_special_tokens, minFrequency: cfg.model.tokenizer_min_frequency });
    saveTokenizer(tokDir, tok, { eosToken: "<|im_end|>", padToken: "<|endoftext|>", bosToken: null, chatTemplate: SPECIAL_CHAT_TEMPLATE });
    log(`[tokenizer] trained byte-level BPE, vocab ${tok.vocabSize}`);
  }
  const eosId = init !== null ? documentSeparator(init.tokenizer, init.dir) : tok!.tokenToId("<|endoftext|>") ?? 0;
  // [validation] dataset: validate on that data (TorchTitan's); else on a held-out fraction of the training documents
  const valDataset = cfg.validation.enable ? cfg.validation.dataset : null;
  const data = buildDatasets({
    docs,
    tokenizer: init?.tokenizer ?? tok!,
    eosId,
    valFraction: cfg.validation.enable && valDataset === null ? cfg.validation.fraction : 0,
    seed: cfg.job.seed,
    cachePath: path.join(dump, "tokens.bin"),
    tokenizerKey: init?.tokenizerKey ?? JSON.stringify(tok!.json.model),
  });
  if (valDataset !== null) data.val = tokenizeDocuments(loadDataset(valDataset, init?.tokenizer ?? null, "[validation] dataset"), init?.tokenizer ?? tok!, eosId);
  log(`[data] ${data.train.length} training tokens, ${data.val.length} validation tokens${valDataset !== null ? ` (from ${valDataset})` : ""}`);
  if (rank === 0 && worldSize > 1) barrier();
  const separator = cfg.model.attn_mask_type === "block_causal" ? eosId : null;
  if (separator !== null) {
    // documents end at the separator, so one inside a document (a chat template's own EOS) splits it there
    let n = 0;
    for (const t of data.train) if (t === separator || t === -separator - 1) n++;
    const inside = n - data.trainDocs;
    log(`[model] attn_mask_type block_causal: tokens attend within their own document (ended by token ${separator}), positions restart per document` +
      (inside > 0 ? `; warning: token ${separator} also occurs ${inside} time(s) inside documents, which it splits` : ""));
  }

  // 2. model
  let model: CausalLM;
  let hfConfig: Record<string, unknown>;
  let lora: TrainedLora | null = null;
  if (init !== null) {
    model = init.model;
    hfConfig = init.hfConfig;
    if (cfg.lora.enable) lora = attachLoraAdapters(model, cfg);
  } else {
    const vocabSize = cfg.model.vocab_size ?? tok!.vocabSize;
    hfConfig = recipeHfConfig(cfg, vocabSize, tok!.tokenToId("<|im_end|>") ?? eosId);
    // unallocated: initWeights installs every parameter (no default init drawn and thrown away)
    model = new CausalLM(parseHfConfig(hfConfig), { dtype: cfg.training.mixed_precision_param, unallocatedParameters: true });
    initWeights(model, cfg.job.seed, cfg.model.n_layers);
  }
  model.train();
  model.activationCheckpointing = activationCheckpointLayers(cfg);
  model.activationCheckpointPolicy = opLevelActivationCheckpoint(cfg) ? opSacPolicy : null;
  const numParams = model.numParameters();
  const B = cfg.training.local_batch_size;
  const S = cfg.training.seq_len;
  const fpt = flopsPerToken(model, S);
  const peak = hooks.peakFlops ?? 117e9;
  const c = model.config;
  const from = init !== null ? ` from ${init.dir}` : "";
  log(`[model] ${c.architecture} ${numParams} parameters${from} (dim ${c.hiddenSize}, ${c.numHiddenLayers} layers, vocab ${c.vocabSize}), ${(fpt / 1e6).toFixed(1)} MFLOP/token; ${defaultDevice().backend.describe()}`);
  if (lora !== null) {
    const n = lora.named.reduce((s, [, t]) => s + t.numel, 0);
    log(`[lora] rank ${cfg.lora.rank} adapters on ${lora.modules.length} projections (${cfg.lora.target_modules.join(", ")}): ${n} trainable parameters, the model's frozen`);
  }
  const recomputed = model.activationCheckpointing;
  if (recomputed !== null) {
    const layers = Array.from({ length: c.numHiddenLayers }, (_, i) => i).filter(recomputed);
    const what = model.activationCheckpointPolicy !== null
      ? "recompute their activations in backward but for the outputs TorchTitan's op policy saves (every other matmul, attention)"
      : "recompute their activations in backward";
    const mode = model.activationCheckpointPolicy !== null ? "selective (op)" : cfg.activation_checkpoint.mode;
    log(`[activation_checkpoint] ${mode}: ${layers.length} of ${c.numHiddenLayers} layers ${what} (${layers.join(", ")})`);
  }
  // what the optimizer updates and the checkpoints hold: the adapters alone under LoRA
  const trained = lora !== null ? lora.named : model.namedParameters();

  // 3. optimizer, schedule, loop
  const o = cfg.optimizer;
  const trainedParams = trained.map(([, t]) => t);
  let optimizer: ReturnType<typeof buildOptimizer> | ZeroRedundancyOptimizer;
  if (degrees.shard > 1) {
    const group = shardGroup(degrees.replicate, degrees.shard, rank);
    optimizer = new ZeroRedundancyOptimizer(trainedParams, (ps) => buildOptimizer(o, ps), undefined, { group });
    const replicas = degrees.replicate > 1 ? `, ${degrees.replicate} replicas of it` : "";
    const mine = optimizer.localOptimizer.params;
    const elements = (ps: readonly Tensor[]): number => ps.reduce((n, p) => n + p.numel, 0);
    log(`[parallelism] optimizer state sharded over ${degrees.shard} ranks${replicas} (ZeRO-1: parameters and gradients replicated); ` +
      `rank ${rank} keeps the state of ${mine.length} of ${trainedParams.length} parameters (${elements(mine)} of ${elements(trainedParams)} elements)`);
  } else optimizer = buildOptimizer(o, trainedParams);
  const ls = cfg.lr_scheduler;
  const schedule = new LrSchedule({
    lr: o.lr, warmupSteps: ls.warmup_steps, totalSteps: cfg.training.steps, decayType: ls.decay_type, lrMin: ls.lr_min,
    ...(ls.decay_ratio !== null ? { decayRatio: ls.decay_ratio } : {}),
  });
  // each rank reads its own batch of every step's worldSize consecutive ones: the global batch is B x worldSize
  let loader: DataLoader;
  try {
    loader = new DataLoader(data.train, { batchSize: B, seqLen: S, seed: cfg.job.seed, rank, worldSize });
  } catch (e) {
    // too little text for one step is the recipe's error (its dataset, batch or seq_len)
    if (e instanceof DataLoaderError) throw new TrainConfigError(`[training] dataset ${cfg.training.dataset}: ${e.message}`);
    throw e;
  }
  // (under LoRA the adapters alone train: their gradients are what the ranks average)
  const ddp = worldSize > 1 ? new DistributedDataParallel(lora?.module ?? model) : null;
  const dataParallel: DataParallelHooks | undefined = ddp === null ? undefined : {
    noSync: (fn) => ddp.noSync(fn),
    averageAcrossRanks: (x) => {
      const t = tensor([x]);
      allReduce(t, "avg");
      return t.item();
    },
    worldSize,
    isWriter: rank === 0,
  };
  const validate = (): number | null => {
    if (!cfg.validation.enable || data.val.length < S + 1) return null;
    const vl = new DataLoader(data.val, { batchSize: B, seqLen: S, seed: 0, shuffle: false });
    const n = Math.min(cfg.validation.steps, vl.batchesPerEpoch);
    let total = 0;
    for (let i = 0; i < n; i++) {
      const b = vl.next();
      total += noGrad(() => {
        const l = model.loss(b.inputs, b.targets, B, S, separator);
        const v = l.item();
        l.dispose();
        return v;
      });
    }
    return n > 0 ? total / n : null;
  };
  const curve: { step: number; loss?: number; valLoss?: number }[] = [];
  const curvePath = cfg.metrics.loss_curve ? (path.isAbsolute(cfg.metrics.loss_curve) ? cfg.metrics.loss_curve : path.join(dump, cfg.metrics.loss_curve)) : null;
  // The curve's points are kept next to it (loss.svg -> loss.svg.json), so a resumed run draws the steps before its
  // checkpoint too: those before the first step it runs.
  const pointsPath = curvePath ? `${curvePath}.json` : null;
  const earlier: typeof curve = (hooks.resume ?? true) && pointsPath && fs.existsSync(pointsPath)
    ? (JSON.parse(fs.readFileSync(pointsPath, "utf8")) as typeof curve)
    : [];
  const drawCurve = (): void => {
    if (!curvePath || rank !== 0) return;
    const points = curve.length > 0 ? curve : earlier; // a finished run resumed runs no step: its curve stays whole
    fs.writeFileSync(curvePath, renderLossCurveSvg(points, { title: `${cfg.job.description || "training"}: loss` }));
    fs.writeFileSync(pointsPath!, JSON.stringify(points));
  };
  let last: StepMetrics | null = null;
  let lastVal: number | null = null;
  let tokSum = 0;
  let msSum = 0;
  const trainable = {
    parameters: () => trained.map(([, t]) => t),
    namedParameters: () => trained,
    loss: (inputs: Int32Array, targets: Int32Array): Tensor => model.loss(inputs, targets, B, S, separator),
  };
  await train({
    model: trainable,
    optimizer,
    schedule,
    dataLoader: loader,
    steps: cfg.training.steps,
    gradAccumulationSteps: accumulation,
    dataParallel,
    maxNorm: cfg.training.max_norm,
    checkpoint: cfg.checkpoint.enable
      ? { dir: path.join(dump, cfg.checkpoint.folder), interval: cfg.checkpoint.interval, keepLatest: cfg.checkpoint.keep_latest_k, resume: resumeFrom(cfg, dump, hooks.resume ?? true), atEnd: true }
      : undefined,
    onStep: (m) => {
      if (last === null) curve.push(...earlier.filter((e) => e.step < m.step));
      last = m;
      tokSum += m.tokens;
      msSum += m.tokens / Math.max(m.tokensPerSecond, 1e-9) * 1000;
      const mfu = (m.tokensPerSecond * fpt) / peak;
      let valLoss: number | undefined;
      if (rank === 0 && cfg.validation.enable && (m.step % cfg.validation.freq === 0 || m.step === cfg.training.steps)) {
        valLoss = validate() ?? undefined;
        if (valLoss !== undefined) lastVal = valLoss;
      }
      curve.push({ step: m.step, loss: m.loss, ...(valLoss !== undefined ? { valLoss } : {}) });
      if (m.step % cfg.metrics.log_freq === 0 || valLoss !== undefined) {
        log(
          `step ${String(m.step).padStart(5)}  loss ${m.loss.toFixed(4)}  grad_norm ${m.gradNorm.toFixed(3)}  lr ${m.lr.toExponential(2)}  ` +
            `tok/s ${m.tokensPerSecond.toFixed(0)}  mfu ${(mfu * 100).toFixed(1)}%  memory ${(m.peakMemoryBytes / 2 ** 30).toFixed(2)}GiB` + (valLoss !== undefined ? `  val_loss ${valLoss.toFixed(4)} (ppl ${Math.exp(valLoss).toFixed(1)})` : ""),
        );
        drawCurve();
      }
      hooks.onStep?.({ ...m, mfu, valLoss }, cfg.training.steps);
    },
  });
  drawCurve();
  const exportDir = path.join(dump, lora !== null ? "lora" : "hf");
  const mergedDir = lora !== null && cfg.lora.export_merged ? path.join(dump, "hf") : null;
  model.eval();
  ddp?.close();
  if (rank === 0 && lora !== null) {
    exportLoraAdapter(exportDir, lora, cfg, init!.dir);
    if (mergedDir !== null) {
      mergeAdapters(model);
      exportModel(mergedDir, model, exportInitialModelFiles(init!, mergedDir, cfg.checkpoint.export_dtype), null, cfg.checkpoint.export_dtype);
    }
  } else if (rank === 0) exportModel(exportDir, model, init !== null ? exportInitialModelFiles(init, exportDir, cfg.checkpoint.export_dtype) : hfConfig, init !== null ? null : tok!, cfg.checkpoint.export_dtype);
  const finalLoss = (last as StepMetrics | null)?.loss ?? [...earlier].reverse().find((e) => e.loss !== undefined)?.loss ?? NaN;
  const tps = msSum > 0 ? tokSum / (msSum / 1000) : 0;
  log(lora !== null ? `[export] PEFT LoRA adapter directory: ${exportDir} (kiln serve ${init!.dir} --enable-lora --lora-modules NAME=${exportDir})` : `[export] Hugging Face model directory: ${exportDir}`);
  if (mergedDir !== null) log(`[export] the model with the adapters merged: ${mergedDir}`);
  return {
    exportDir,
    finalLoss,
    valLoss: lastVal,
    valPerplexity: lastVal === null ? null : Math.exp(lastVal),
    numParams,
    tokensPerSecond: tps,
    mfu: (tps * fpt) / peak,
    seconds: (performance.now() - t0) / 1000,
    rank,
    worldSize,
  };
}
