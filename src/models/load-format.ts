// How a model is read, beyond its files (vLLM's LoadConfig.load_format and ModelConfig.hf_overrides): which reader
// takes the weights (or none: random "dummy" weights of the config's shapes), and config.json keys the caller
// overrides before the model is built.
/**
 * vLLM's --load-format values Kiln reads: "auto" (a directory's safetensors, else its PyTorch .bin checkpoint, or a
 * GGUF file), "safetensors", "pt" and "gguf" (that format, or an error naming what the path holds), "dummy" (random
 * weights, no tensor read).
 */
export const LOAD_FORMATS = ["auto", "safetensors", "pt", "gguf", "dummy"] as const;
export type LoadFormat = (typeof LOAD_FORMATS)[number];

export const isLoadFormat = (x: unknown): x is LoadFormat => (LOAD_FORMATS as readonly unknown[]).includes(x);

/**
 * Why `format` cannot read weights stored as `found`, or null when it can: "auto" reads either, "dummy" reads none
 * but needs a Hugging Face directory's config.json.
 */
export function loadFormatMismatch(format: LoadFormat, found: "safetensors" | "pt" | "gguf"): string | null {
  if (format === "auto" || format === found || (format === "dummy" && found !== "gguf")) return null;
  if (format === "dummy") return 'load_format "dummy" needs a Hugging Face model directory (config.json), not a GGUF file';
  return `load_format "${format}" was asked, but the model's weights are ${found}`;
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * config.json with `overrides` over it, as vLLM applies hf_overrides: each key replaces the config's, except that an
 * object given for a nested config (text_config, vision_config: a `*_config` object other than quantization_config)
 * is merged into it, key by key. A null sets the key to null (most then read as absent).
 * @example applyHfOverrides({ max_position_embeddings: 4096, rope_theta: 1e4 }, { max_position_embeddings: 2048 })
 */
export function applyHfOverrides(config: Json, overrides: Json | null | undefined): Json {
  if (!overrides) return config;
  const out: Json = { ...config };
  for (const [key, value] of Object.entries(overrides)) {
    const current = out[key];
    const nested = key.endsWith("_config") && key !== "quantization_config" && isObject(current) && isObject(value);
    out[key] = nested ? applyHfOverrides(current, value) : value;
  }
  return out;
}
