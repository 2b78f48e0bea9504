// An image-text Gemma 3's configuration, apart from its weights: config.json's vision_config and image fields, and
// what a server or router needs to turn a request's images into the model's input (the processor's settings and the
// image token), read from the model directory without loading the runtime (the router reads them too).
import * as fs from "node:fs";
import * as path from "node:path";
import { KilnError } from "../util/errors.js";
import { GEMMA3_IMAGE_DEFAULTS, GEMMA3_IMAGE_TOKEN, type Gemma3ImageInputSpec, type Gemma3ImageProcessorConfig } from "./gemma3-image-processor.js";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS, PAN_AND_SCAN_KEYS, type PanAndScanConfig } from "./gemma3-pan-and-scan.js";
import type { TokenizerLike } from "./tokenizer-types.js";

type Json = Record<string, unknown>;

export class VisionConfigError extends KilnError {
  override name = "VisionConfigError";
}

/** What Gemma3Config's vision_config and its own image fields give the vision side. */
export interface Gemma3VisionConfig {
  hiddenSize: number; // vision_config.hidden_size (1152)
  intermediateSize: number; // 4304
  numLayers: number; // 27
  numHeads: number; // 16
  imageSize: number; // 896
  patchSize: number; // 14
  layerNormEps: number; // 1e-6
  /** Text model's hidden size: the projector's output. */
  textHiddenSize: number;
  /** Rows per image after pooling (256): a square number whose side divides the patch grid's. */
  mmTokensPerImage: number;
  /** Token ids: the soft image token each row replaces (262144), and the image's begin / end markers. */
  imageTokenIndex: number;
  boiTokenIndex: number;
  eoiTokenIndex: number;
}

/** Gemma3Config's vision fields (HF's defaults where the config leaves them out). */
export function parseGemma3VisionConfig(json: Json, textHiddenSize: number): Gemma3VisionConfig {
  const v = (json.vision_config ?? {}) as Json;
  if (typeof v !== "object" || Array.isArray(v)) throw new VisionConfigError("[config] Gemma3ForConditionalGeneration: vision_config must be an object");
  const int = (o: Json, key: string, dflt: number): number => {
    const x = o[key] ?? dflt;
    if (typeof x !== "number" || !Number.isInteger(x) || x <= 0) throw new VisionConfigError(`[config] Gemma3ForConditionalGeneration: "${key}" must be a positive integer, got ${JSON.stringify(x)}`);
    return x;
  };
  const act = v.hidden_act ?? "gelu_pytorch_tanh";
  if (act !== "gelu_pytorch_tanh")
    throw new VisionConfigError(`[config] Gemma3ForConditionalGeneration: vision hidden_act ${JSON.stringify(act)} is not supported (gelu_pytorch_tanh)`);
  const cfg: Gemma3VisionConfig = {
    hiddenSize: int(v, "hidden_size", 1152),
    intermediateSize: int(v, "intermediate_size", 4304),
    numLayers: int(v, "num_hidden_layers", 27),
    numHeads: int(v, "num_attention_heads", 16),
    imageSize: int(v, "image_size", 896),
    patchSize: int(v, "patch_size", 14),
    layerNormEps: typeof v.layer_norm_eps === "number" ? v.layer_norm_eps : 1e-6,
    textHiddenSize,
    mmTokensPerImage: int(json, "mm_tokens_per_image", 256),
    imageTokenIndex: int(json, "image_token_index", 262_144),
    boiTokenIndex: int(json, "boi_token_index", 255_999),
    eoiTokenIndex: int(json, "eoi_token_index", 256_000),
  };
  const side = cfg.imageSize / cfg.patchSize;
  const tokSide = Math.round(Math.sqrt(cfg.mmTokensPerImage));
  if (!Number.isInteger(side) || tokSide * tokSide !== cfg.mmTokensPerImage || side % tokSide !== 0)
    throw new VisionConfigError(
      `[config] Gemma3ForConditionalGeneration: image_size ${cfg.imageSize} / patch_size ${cfg.patchSize} patches a side must pool evenly to ` +
        `sqrt(mm_tokens_per_image ${cfg.mmTokensPerImage})`,
    );
  if (cfg.hiddenSize % cfg.numHeads !== 0) throw new VisionConfigError(`[config] vision hidden_size ${cfg.hiddenSize} is not a multiple of num_attention_heads ${cfg.numHeads}`);
  return cfg;
}

/**
 * Gemma3ImageProcessor's settings: preprocessor_config.json's image_mean, image_std, size and pan-and-scan keys
 * (do_pan_and_scan, pan_and_scan_*; null: Gemma3Processor's defaults) where the directory has one, else HF's defaults
 * at vision_config.image_size.
 */
export function readGemma3ImageProcessorConfig(dir: string, imageSize: number): Gemma3ImageProcessorConfig {
  const file = path.join(dir, "preprocessor_config.json");
  const json = fs.existsSync(file) ? (JSON.parse(fs.readFileSync(file, "utf8")) as Json) : {};
  let panAndScan: PanAndScanConfig;
  try {
    panAndScan = applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, Object.fromEntries(Object.entries(json).filter(([k]) => PAN_AND_SCAN_KEYS.includes(k))));
  } catch (e) {
    if (e instanceof MmProcessorKwargsError) throw new VisionConfigError(`${file}: ${e.message.replace(/^mm_processor_kwargs: /, "")}`);
    throw e;
  }
  const triple = (key: string, dflt: readonly [number, number, number]): [number, number, number] => {
    const v = json[key];
    if (v === undefined || v === null) return [...dflt];
    if (!Array.isArray(v) || v.length !== 3 || !v.every((x) => typeof x === "number" && Number.isFinite(x)))
      throw new VisionConfigError(`${file}: ${key} must be three numbers, got ${JSON.stringify(v)}`);
    return v as [number, number, number];
  };
  const size = json.size as { height?: unknown; width?: unknown } | undefined;
  if (size !== undefined && (size.height !== imageSize || size.width !== imageSize))
    throw new VisionConfigError(`${file}: size ${JSON.stringify(size)} is not the vision tower's image_size ${imageSize}`);
  return { imageSize, imageMean: triple("image_mean", GEMMA3_IMAGE_DEFAULTS.imageMean), imageStd: triple("image_std", GEMMA3_IMAGE_DEFAULTS.imageStd), panAndScan };
}

/**
 * What a server needs to turn a request's images into an image-text Gemma 3 model's input (gemma3ImagePrompt), read
 * from the model directory's config.json and preprocessor_config.json; null for any other model. The tokenizer must
 * spell `<image_soft_token>` as the config's image_token_index.
 */
export function gemma3ImageInputSpec(dir: string, tokenizer: TokenizerLike): Gemma3ImageInputSpec | null {
  const file = path.join(dir, "config.json");
  if (!fs.existsSync(file)) return null;
  const json = JSON.parse(fs.readFileSync(file, "utf8")) as Json;
  if (!Array.isArray(json.architectures) || json.architectures[0] !== "Gemma3ForConditionalGeneration") return null;
  const text = (json.text_config ?? {}) as Json;
  const cfg = parseGemma3VisionConfig(json, typeof text.hidden_size === "number" ? text.hidden_size : 1);
  const ids = tokenizer.encode(GEMMA3_IMAGE_TOKEN, { addSpecialTokens: false });
  if (ids.length !== 1 || ids[0] !== cfg.imageTokenIndex)
    throw new VisionConfigError(`${dir}: the tokenizer spells ${GEMMA3_IMAGE_TOKEN} as [${ids.join(", ")}], the config's image_token_index is ${cfg.imageTokenIndex}`);
  return { processor: readGemma3ImageProcessorConfig(dir, cfg.imageSize), mmTokensPerImage: cfg.mmTokensPerImage, imageTokenIndex: cfg.imageTokenIndex };
}
