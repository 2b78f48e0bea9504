// Reads an image-text Gemma 3 checkpoint's vision side (Gemma3Vision): `vision_tower.vision_model.*` and
// `multi_modal_projector.*` (transformers before 4.52) or the same under `model.` (after). Its image processor's
// settings (preprocessor_config.json) and image input are gemma3-vision-config.ts's, re-exported here.
import type { DType } from "../backends/dtype.js";
import { tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import { dummyParameter } from "./dummy-weights.js";
import type { SafetensorsHandle } from "./formats/safetensors.js";
import { Gemma3Vision, VisionConfigError, parseGemma3VisionConfig, visionParamDtype } from "./siglip.js";

export { gemma3ImageInputSpec, readGemma3ImageProcessorConfig } from "./gemma3-vision-config.js";

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
