// Kiln's public entry point: the tensor runtime, nn layers, model loading, the engine's offline and
// streaming APIs, the server, and the training recipe.
export * as tensor from "./tensor/index.js";
export * as nn from "./nn/index.js";
export { loadModel, loadLocalModel, type LoadedModel, type LoadOptions } from "./models/loader.js";
export { CausalLM } from "./models/causal-lm.js";
export { Tokenizer } from "./models/tokenizer.js";
export { parseHfConfig, type ModelConfig } from "./models/hf-config.js";
export { initModel, exportGguf } from "./models/init-model.js";
export { LLM } from "./engine/llm-engine.js";
export { AsyncLLM } from "./engine/async-llm.js";
export type { LoraRequest } from "./engine/lora-manager.js";
export { readLoraAdapter, LoraError, type LoraAdapter } from "./models/lora.js";
export { createServingSetup, createServingSetupSync, type ServingArgs } from "./engine/serving.js";
export type { SamplingParams, RequestOutput, CompletionOutput, EngineClient } from "./engine/types.js";
export { createServer } from "./server/index.js";
export { runRecipe } from "./train/recipe.js";
export { registerBackend, backendNames } from "./backends/registry.js";
export type { Backend, KernelCall } from "./backends/backend.js";
