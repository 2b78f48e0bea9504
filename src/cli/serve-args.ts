// `kiln serve` flags (vLLM's names and meanings), parsed into one typed, validated ServeArgs. Each group of flags
// lives in a module of its own (declared there and validated there); this one puts them together and checks the
// combinations across groups.
import type { Command } from "commander";
import { addChatOptions, parseChatArgs, type ChatArgs } from "./serve-chat-args.js";
import { addCompatOptions, checkCompatArgs, parseMmLimits } from "./serve-compat-args.js";
import { addEngineFlagOptions, parseEngineFlagArgs, type EngineFlagArgs } from "./serve-engine-args.js";
import { addFeatureOptions, addStructuredOutputOptions, parseFeatureArgs, type FeatureArgs } from "./serve-feature-args.js";
import { addFrontendOptions, parseFrontendArgs, type FrontendArgs } from "./serve-frontend-args.js";
import { addLoadOptions, parseLoadArgs, type LoadArgs } from "./serve-load-args.js";
import { addModelOptions, parseModelArgs, type ModelArgs } from "./serve-model-args.js";
import { addMmOptions, parseMmArgs, type MmArgs } from "./serve-mm-args.js";
import { CliUsageError } from "./usage-error.js";

export type { Dtype } from "./serve-model-args.js";
export { QUANTIZATION_METHODS } from "./serve-model-args.js";
export type { KvCacheDtypeArg, SchedulingPolicy } from "./serve-engine-args.js";
export type { LogLevel, LoraModuleArg } from "./serve-frontend-args.js";
export { parseBytes } from "./serve-flag-values.js";
export { expandMultiLetterShortFlags } from "./serve-compat-args.js";
export { CliUsageError };

export interface ServeArgs extends ModelArgs, LoadArgs, EngineFlagArgs, FeatureArgs, FrontendArgs, ChatArgs, Omit<MmArgs, "rgbaBackground"> {
  /** vLLM's --limit-mm-per-prompt, by modality, or null (vLLM's default: 999 each). */
  limitMmPerPrompt: Record<string, number> | null;
  /** vLLM flags accepted with no effect in Kiln (or read another way), one line each: printed before the model loads. */
  warnings: string[];
}

/** Declares the engine-shaping flags on `cmd` (serve, and generate/chat, which run the engine without a server). */
export function addEngineOptions(cmd: Command, o: { quantizationShort?: boolean } = {}): Command {
  return addMmOptions(addCompatOptions(addFeatureOptions(addEngineFlagOptions(addLoadOptions(addModelOptions(cmd, o))))));
}

/** Declares every serve flag on `cmd`. */
export function addServeOptions(cmd: Command): Command {
  return addFrontendOptions(addStructuredOutputOptions(addChatOptions(addEngineOptions(cmd))));
}

/** Validates commander's raw option values (all strings) into ServeArgs. */
export function parseServeArgs(model: string | undefined, o: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): ServeArgs {
  const warnings: string[] = [];
  const modelArgs = parseModelArgs(model, o, warnings);
  const load = parseLoadArgs(modelArgs.model, o, warnings);
  const engine = parseEngineFlagArgs(o, warnings);
  const frontend = parseFrontendArgs(model, o, env, warnings);
  const chat = parseChatArgs(o);
  const features = parseFeatureArgs(o, { ...frontend, tensorParallelSize: engine.tensorParallelSize });
  checkCompatArgs(o, warnings);
  const { rgbaBackground, ...mm } = parseMmArgs(o, warnings);
  // across groups
  if (features.speculativeConfig !== null && engine.asyncScheduling === true)
    throw new CliUsageError("--async-scheduling cannot be combined with --speculative-config");
  if (frontend.loraModules.length > 0 && !engine.enableLora) throw new CliUsageError("--lora-modules needs --enable-lora");
  if (features.runner === "pooling" && engine.enableLora) throw new CliUsageError("--enable-lora needs the generate runner");
  if (features.runner === "pooling" && features.speculativeConfig !== null) throw new CliUsageError("--speculative-config needs the generate runner");
  // what reads the vocabulary cannot run without a tokenizer (vLLM fails on them too)
  if (load.skipTokenizerInit) {
    const needs = [
      [chat.toolCallParser !== null, "--tool-call-parser"], [features.reasoningParser !== null, "--reasoning-parser"], [chat.chatTemplate !== null, "--chat-template"],
    ] as const;
    for (const [given, flag] of needs) if (given) throw new CliUsageError(`${flag} reads the tokenizer: it cannot be combined with --skip-tokenizer-init`);
  }
  const limitMmPerPrompt = o.limitMmPerPrompt === undefined ? null : parseMmLimits(o.limitMmPerPrompt);
  // (the image loader's background is part of how images are read: with where they may come from)
  const mediaAccess = { ...frontend.mediaAccess, ...(rgbaBackground !== null ? { rgbaBackground } : {}) };
  return { ...modelArgs, ...load, ...engine, ...features, ...frontend, ...chat, ...mm, mediaAccess, limitMmPerPrompt, warnings };
}
