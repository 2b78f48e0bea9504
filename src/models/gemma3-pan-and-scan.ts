// Gemma 3's pan-and-scan (HF Gemma3ImageProcessor.pan_and_scan): an image whose aspect ratio reaches a threshold is
// also cut into 2..max_num_crops crops along its long side, each then processed like a whole image. And the
// processor kwargs that set it (preprocessor_config.json, vLLM's --mm-processor-kwargs and a request's
// mm_processor_kwargs), read and checked in one place.
import { KilnError } from "../util/errors.js";
import type { RgbImage } from "./image-decode.js";

/** Pan-and-scan's settings (Gemma3ProcessorKwargs' images_kwargs names, camel-cased). */
export interface PanAndScanConfig {
  doPanAndScan: boolean;
  /** The smallest crop side: fewer crops when the long side would give smaller ones, none when even 2 would. */
  minCropSize: number;
  maxNumCrops: number;
  /** The long side / short side ratio from which an image is cropped. */
  minRatioToActivate: number;
}

/** Gemma3ProcessorKwargs' defaults: off; when on, crops of at least 256 px, at most 4, from a 1.2 aspect ratio. */
export const PAN_AND_SCAN_DEFAULTS: PanAndScanConfig = { doPanAndScan: false, minCropSize: 256, maxNumCrops: 4, minRatioToActivate: 1.2 };

/** One crop: its top-left corner and size in the original image's pixels (a last crop may be cut by the edge). */
export interface CropBox {
  x: number;
  y: number;
  width: number;
  height: number;
}

/**
 * The crops HF's pan_and_scan takes of a `width` x `height` image, left to right or top to bottom; none when off, when
 * the aspect ratio is under the threshold, or when a crop would be under the minimum size.
 */
export function panAndScanCrops(width: number, height: number, cfg: PanAndScanConfig): CropBox[] {
  if (!cfg.doPanAndScan) return [];
  const landscape = width >= height; // (a square counts as landscape, and its ratio 1 is under any threshold > 1)
  const long = landscape ? width : height, short = landscape ? height : width;
  if (long / short < cfg.minRatioToActivate) return [];
  // crops close to the aspect ratio (rounded half up), no smaller than the minimum size, within [2, max]
  let n = Math.min(Math.floor(long / cfg.minCropSize), Math.floor(long / short + 0.5));
  n = Math.min(cfg.maxNumCrops, Math.max(2, n));
  const numW = landscape ? n : 1, numH = landscape ? 1 : n;
  const cropW = Math.ceil(width / numW), cropH = Math.ceil(height / numH);
  if (Math.min(cropW, cropH) < cfg.minCropSize) return [];
  const boxes: CropBox[] = [];
  for (let i = 0; i < numH; i++) {
    for (let j = 0; j < numW; j++) {
      const x = j * cropW, y = i * cropH;
      // numpy's slice [y : y + cropH, x : x + cropW] stops at the edge
      boxes.push({ x, y, width: Math.min(cropW, width - x), height: Math.min(cropH, height - y) });
    }
  }
  return boxes;
}

/** The pixels of one crop of an image. */
export function cropImage(img: RgbImage, box: CropBox): RgbImage {
  const data = new Uint8Array(box.width * box.height * 3);
  for (let y = 0; y < box.height; y++) {
    const from = ((box.y + y) * img.width + box.x) * 3;
    data.set(img.data.subarray(from, from + box.width * 3), y * box.width * 3);
  }
  return { width: box.width, height: box.height, data };
}

/** Processor kwargs Kiln cannot take: an unknown key or a value of the wrong type; `key` names it. */
export class MmProcessorKwargsError extends KilnError {
  override name = "MmProcessorKwargsError";
  constructor(
    readonly key: string,
    message: string,
  ) {
    super(message);
  }
}

/** The kwargs taken, each with its field and a check of its value. */
const KWARGS: Record<string, { field: keyof PanAndScanConfig; kind: string; ok: (v: unknown) => boolean }> = {
  do_pan_and_scan: { field: "doPanAndScan", kind: "a boolean", ok: (v) => typeof v === "boolean" },
  pan_and_scan_min_crop_size: { field: "minCropSize", kind: "a positive integer", ok: (v) => Number.isInteger(v) && (v as number) > 0 },
  pan_and_scan_max_num_crops: { field: "maxNumCrops", kind: "a positive integer", ok: (v) => Number.isInteger(v) && (v as number) > 0 },
  pan_and_scan_min_ratio_to_activate: { field: "minRatioToActivate", kind: "a positive number", ok: (v) => typeof v === "number" && Number.isFinite(v) && v > 0 },
};

/** The processor kwargs' names (preprocessor_config.json's and mm_processor_kwargs'). */
export const PAN_AND_SCAN_KEYS: readonly string[] = Object.keys(KWARGS);

/**
 * `base` with the snake_case processor kwargs of `kwargs` applied (vLLM's mm_processor_kwargs for Gemma 3: the four
 * pan-and-scan keys; null values keep the base's). Anything else is an MmProcessorKwargsError naming the key.
 */
export function applyMmProcessorKwargs(base: PanAndScanConfig, kwargs: unknown): PanAndScanConfig {
  if (kwargs === undefined || kwargs === null) return base;
  if (typeof kwargs !== "object" || Array.isArray(kwargs)) throw new MmProcessorKwargsError("", `mm_processor_kwargs must be a JSON object, got ${JSON.stringify(kwargs)}`);
  const out = { ...base };
  for (const [key, value] of Object.entries(kwargs)) {
    const spec = KWARGS[key];
    if (spec === undefined)
      throw new MmProcessorKwargsError(key, `mm_processor_kwargs: unknown key '${key}' (Gemma 3 takes ${PAN_AND_SCAN_KEYS.join(", ")})`);
    if (value === null) continue;
    if (!spec.ok(value)) throw new MmProcessorKwargsError(key, `mm_processor_kwargs: '${key}' must be ${spec.kind}, got ${JSON.stringify(value)}`);
    (out as Record<string, unknown>)[spec.field] = value;
  }
  return out;
}
