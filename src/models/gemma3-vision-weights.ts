// Reads an image-text Gemma 3 checkpoint's vision side (Gemma3Vision) and its image processor's settings:
// `vision_tower.vision_model.*` and `multi_modal_projector.*` (transformers before 4.52) or the same under `model.`
// (after), and preprocessor_config.json.
import * as fs from "node:fs";
import * as path from "node:path";
import type { DType } from "../backends/dtype.js";
import { tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import { dummyParameter } from "./dummy-weights.js";
import type { SafetensorsHandle } from "./formats/safetensors.js";
import { GEMMA3_IMAGE_DEFAULTS, GEMMA3_IMAGE_TOKEN, type Gemma3ImageInputSpec, type Gemma3ImageProcessorConfig } from "./gemma3-image-processor.js";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS, PAN_AND_SCAN_KEYS, type PanAndScanConfig } from "./gemma3-pan-and-scan.js";
import type { TokenizerLike } from "./tokenizer-types.js";
import { Gemma3Vision, VisionConfigError, parseGemma3VisionConfig, visionParamDtype } from "./siglip.js";

type Json = Record<string, unknown>;

/**
 * The vision tower and projector of a Gemma3ForConditionalGeneration checkpoint (`file`: its tensors under their own
 * names; null: --load-format dummy, random weights). Linear matrices take `dtype`, the rest float32.
 */
export function loadGemma3Vision(
  file: SafetensorsHandle | null, rawConfig: Json, textHiddenSize: number, dtype: DType, device: DeviceLike | undefined, dir: string,
): Gemma3Vision {
  const cfg = parseGemma3VisionConfig(rawConfig, textHiddenSize);
  const vision = new Gemma3Vision(cfg, { dtype, device, unallocatedParameters: true });
  const prefix = file === null || file.has("vision_tower.vision_model.embeddings.patch_embedding.weight") ? "" : "model.";
  const modelDtype = dtype === "bfloat16" ? "bfloat16" : "float32";
  const missing: string[] = [];
  for (const [name, t] of vision.namedParameters()) {
    const want = visionParamDtype(name, modelDtype);
    if (file === null) {
      // LayerNorms at scale 1, the (1 + w) RMSNorm at w = 0
      const ones = /layer_?norm\d?\.weight$/.test(name);
      vision.setParameter(name, ones ? tensor(new Float32Array(t.numel).fill(1), { shape: [...t.shape], device }) : dummyParameter(name, t.shape, want, 1, device));
      continue;
    }
    const stored = prefix + name;
    const info = file.get(stored);
    if (info === undefined) {
      missing.push(stored);
      continue;
    }
    if (info.shape.join() !== t.shape.join())
      throw new VisionConfigError(`${dir}: tensor ${stored} is [${info.shape.join(", ")}], the vision config says [${t.shape.join(", ")}]`);
    vision.setParameter(name, asDtype(tensor(file.loadAsFloat32(stored), { shape: info.shape, device }), want));
  }
  if (missing.length > 0) throw new VisionConfigError(`${dir}: checkpoint lacks ${missing.length} vision parameters, e.g. ${missing.slice(0, 3).join(", ")}`);
  vision.eval();
  return vision;
}

function asDtype(t: Tensor, dtype: DType): Tensor {
  if (t.dtype === dtype) return t;
  const cast = t.to(dtype);
  t.dispose();
  return cast;
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
