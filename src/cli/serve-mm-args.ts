// vLLM's multimodal `serve` flags besides --limit-mm-per-prompt (MultiModalConfig's, and SchedulerConfig's
// disable_chunked_mm_input): how images are loaded and processed, and how a chat's images meet its text.
import type { Command } from "commander";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS } from "../models/gemma3-pan-and-scan.js";
import { jsonObjectFlag } from "./serve-flag-values.js";
import { CliUsageError } from "./usage-error.js";

export interface MmArgs {
  /** --mm-processor-kwargs: the image processor's settings over preprocessor_config.json's (checked), or null. */
  mmProcessorKwargs: Record<string, unknown> | null;
  /** --media-io-kwargs' image.rgba_background_color: what a transparent image is composited over (null: white). */
  rgbaBackground: readonly [number, number, number] | null;
  /** --interleave-mm-strings: a "string" content format writes a message's images where its parts put them. */
  interleaveMmStrings: boolean;
}

export function addMmOptions(cmd: Command): Command {
  return cmd
    .option("--mm-processor-kwargs <json>", 'the image processor\'s settings, as JSON (Gemma 3: {"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_ratio_to_activate": 1.2}); a request\'s mm_processor_kwargs overrides them')
    .option("--media-io-kwargs <json>", 'how media is loaded, by modality, as JSON: {"image": {"rgba_background_color": [255, 255, 255]}} (the colour under a transparent image; default white)')
    .option("--interleave-mm-strings", "with a \"string\" chat template content format, write a message's images and texts in their order (default: its images first)", false)
    .option("--disable-chunked-mm-input", "accepted for vLLM compatibility: Kiln never splits an image's tokens (nor a pan-and-scan crop's) between steps", false);
}

/** Checks the multimodal flags; `warnings` gets a line for settings of modalities Kiln does not take. */
export function parseMmArgs(o: Record<string, unknown>, warnings: string[]): MmArgs {
  let mmProcessorKwargs: Record<string, unknown> | null = null;
  if (o.mmProcessorKwargs !== undefined) {
    mmProcessorKwargs = jsonObjectFlag(o.mmProcessorKwargs, "--mm-processor-kwargs", '{"do_pan_and_scan": true}');
    try {
      applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, mmProcessorKwargs);
    } catch (e) {
      if (e instanceof MmProcessorKwargsError) throw new CliUsageError(`--mm-processor-kwargs: ${e.message.replace(/^mm_processor_kwargs: /, "")}`);
      throw e;
    }
  }
  return { mmProcessorKwargs, rgbaBackground: parseMediaIoKwargs(o.mediaIoKwargs, warnings), interleaveMmStrings: o.interleaveMmStrings === true };
}

/**
 * --media-io-kwargs: vLLM's per-modality loader kwargs. Of images (vLLM's ImageMediaIO) Kiln takes
 * rgba_background_color (and image_mode "RGB", the mode it reads); another image key or mode is refused, another modality's kwargs warned of (Kiln takes images only).
 */
function parseMediaIoKwargs(value: unknown, warnings: string[]): readonly [number, number, number] | null {
  if (value === undefined) return null;
  const flag = "--media-io-kwargs";
  const kwargs = jsonObjectFlag(value, flag, '{"image": {"rgba_background_color": [0, 0, 0]}}');
  let background: readonly [number, number, number] | null = null;
  for (const [modality, v] of Object.entries(kwargs)) {
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new CliUsageError(`${flag}: ${modality} must map to an object of kwargs, got ${JSON.stringify(v)}`);
    if (modality !== "image") {
      warnings.push(`${flag}: no effect: Kiln takes images only, ${modality} kwargs are not read`);
      continue;
    }
    for (const [key, kv] of Object.entries(v as Record<string, unknown>)) {
      if (key === "image_mode") {
        // (the mode images are read in: Gemma 3's processor takes RGB)
        if (kv !== "RGB") throw new CliUsageError(`${flag}: image.image_mode ${JSON.stringify(kv)} is not supported: images are read as RGB`);
        continue;
      }
      if (key !== "rgba_background_color")
        throw new CliUsageError(`${flag}: image.${key} is not supported (Kiln's image loader takes rgba_background_color, and image_mode "RGB")`);
      if (!Array.isArray(kv) || kv.length !== 3 || !kv.every((c) => Number.isInteger(c) && (c as number) >= 0 && (c as number) <= 255))
        throw new CliUsageError(`${flag}: image.rgba_background_color must be three integers in 0..255 ([R, G, B]), got ${JSON.stringify(kv)}`);
      background = kv as unknown as [number, number, number];
    }
  }
  return background;
}
