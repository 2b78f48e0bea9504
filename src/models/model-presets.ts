// The shape presets of `kiln init-model` and the GGUF types of `kiln convert`: plain data, importable by the CLI
// without loading the model code.

type Json = Record<string, unknown>;

/** Shape presets: tiny/small for tests, SmolLM-135M- and Llama-3.2-1B-shaped for benchmarks. */
export const PRESETS: Record<string, Json> = {
  tiny: { hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 512 },
  small: { hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4, max_position_embeddings: 2048 },
  "smollm-135m": {
    hidden_size: 576, intermediate_size: 1536, num_hidden_layers: 30, num_attention_heads: 9, num_key_value_heads: 3,
    max_position_embeddings: 2048, vocab_size: 49152, tie_word_embeddings: true, rope_theta: 10000, rms_norm_eps: 1e-5,
  },
  "llama-1b": {
    hidden_size: 2048, intermediate_size: 8192, num_hidden_layers: 16, num_attention_heads: 32, num_key_value_heads: 8,
    max_position_embeddings: 4096, vocab_size: 128256, tie_word_embeddings: true, rope_theta: 500000, rms_norm_eps: 1e-5,
  },
};

/** GGUF tensor types exportGguf writes (`kiln convert --outtype`). */
export const GGUF_EXPORT_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q4_K_M", "Q5_K", "Q6_K", "IQ4_NL", "MXFP4"] as const;
export type GgufExportType = (typeof GGUF_EXPORT_TYPES)[number];
