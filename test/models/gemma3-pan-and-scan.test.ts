// Gemma 3's pan-and-scan against crops worked out by hand from HF's Gemma3ImageProcessor.pan_and_scan (the number of
// crops: the aspect ratio rounded half up, at most long_side // min_crop_size, within [2, max_num_crops]; the crop
// side ceil(side / crops); none under the ratio threshold or when a crop would be under the minimum size), the prompt
// text Gemma3Processor writes for an image with crops, and the processor kwargs' checks.
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import {
  expandGemma3ImageTokens, gemma3ImagePrompt, gemma3ImageText, gemma3ImageWithCrops, gemma3PixelValues, GEMMA3_IMAGE_DEFAULTS, withMmProcessorKwargs,
  type Gemma3ImageInputSpec,
} from "../../src/models/gemma3-image-processor.js";
import { applyMmProcessorKwargs, MmProcessorKwargsError, PAN_AND_SCAN_DEFAULTS, panAndScanCrops } from "../../src/models/gemma3-pan-and-scan.js";
import { readGemma3ImageProcessorConfig } from "../../src/models/gemma3-vision-weights.js";
import { VisionConfigError } from "../../src/models/siglip.js";

const ON = { ...PAN_AND_SCAN_DEFAULTS, doPanAndScan: true };
const boxes = (w: number, h: number, cfg = ON) => panAndScanCrops(w, h, cfg).map((b) => [b.x, b.y, b.width, b.height]);

describe("Gemma 3 pan-and-scan", () => {
  it("crops a landscape image along its width: round(1000/300) = 3 crops of ceil(1000/3) = 334 px, the last cut to 332", () => {
    assert.deepEqual(boxes(1000, 300), [[0, 0, 334, 300], [334, 0, 334, 300], [668, 0, 332, 300]]);
  });

  it("crops a portrait image along its height: round(1800/400) = 5, capped at max_num_crops 4, of 450 px", () => {
    assert.deepEqual(boxes(400, 1800), [[0, 0, 400, 450], [0, 450, 400, 450], [0, 900, 400, 450], [0, 1350, 400, 450]]);
  });

  it("activates from the ratio threshold up (1.2: 600x500 gives at least 2 crops of 300 px) and not below (1100x1000)", () => {
    assert.deepEqual(boxes(600, 500), [[0, 0, 300, 500], [300, 0, 300, 500]]);
    assert.deepEqual(boxes(1100, 1000), []);
    assert.deepEqual(boxes(500, 500), []);
  });

  it("takes none of a tiny image (300x100: 2 crops of 150x100, under min_crop_size 256), nor with pan-and-scan off", () => {
    assert.deepEqual(boxes(300, 100), []);
    assert.deepEqual(boxes(1000, 300, PAN_AND_SCAN_DEFAULTS), []);
  });

  it("follows the settings: min_crop_size 100 lets 1000/100 = 10 crops, max_num_crops 2 keeps 2 of 500 px; ratio 4 stops 1000x300", () => {
    assert.deepEqual(boxes(1000, 300, { ...ON, minCropSize: 100, maxNumCrops: 2 }), [[0, 0, 500, 300], [500, 0, 500, 300]]);
    assert.deepEqual(boxes(1000, 300, { ...ON, minRatioToActivate: 4 }), []);
    // min_crop_size bounds the count: floor(1000 / 400) = 2 crops although round(1000 / 300) = 3
    assert.deepEqual(boxes(1000, 300, { ...ON, minCropSize: 400 }), []); // (2 crops of 500x300: 300 < 400)
    assert.deepEqual(boxes(1000, 260, { ...ON, minCropSize: 260 }), [[0, 0, 334, 260], [334, 0, 334, 260], [668, 0, 332, 260]]);
    assert.deepEqual(boxes(1000, 200, { ...ON, minCropSize: 200 }), [[0, 0, 250, 200], [250, 0, 250, 200], [500, 0, 250, 200], [750, 0, 250, 200]]);
  });

  it("processes the original then each crop as an image: the crops' pixels are the image's, resized alike", () => {
    // 6x2, each pixel's red = its x: crops of 2x2 (min_crop_size 2: round(3) = 3 crops)
    const data = new Uint8Array(6 * 2 * 3);
    for (let y = 0; y < 2; y++) for (let x = 0; x < 6; x++) data.set([x * 40, y * 100, 7], (y * 6 + x) * 3);
    const img = { width: 6, height: 2, data };
    const cfg = { imageSize: 2, ...GEMMA3_IMAGE_DEFAULTS, panAndScan: { ...ON, minCropSize: 2 } };
    const out = gemma3ImageWithCrops(img, cfg);
    assert.equal(out.length, 4);
    assert.deepEqual(out[0], gemma3PixelValues(img, cfg));
    for (let k = 0; k < 3; k++) {
      // crop k: x = 2k, 2k+1 (red 80k, 80k+40); at 2x2 it is unresized: channel 0 = red / 127.5 - 1
      const red = [80 * k, 80 * k + 40, 80 * k, 80 * k + 40].map((r) => Math.fround(Math.fround(Math.fround(r / 255) - 0.5) / 0.5));
      assert.deepEqual([...out[k + 1]!.subarray(0, 4)], red, `crop ${k}`);
    }
    assert.equal(gemma3ImageWithCrops(img, { ...cfg, panAndScan: PAN_AND_SCAN_DEFAULTS }).length, 1);
  });

  it("writes Gemma3Processor's text for an image with crops", () => {
    const seq = "\n\n<start_of_image><image_soft_token><image_soft_token><end_of_image>\n\n";
    assert.equal(gemma3ImageText(0, 2), seq);
    assert.equal(gemma3ImageText(2, 2), `Here is the original image ${seq} and here are some crops to help you see better ${seq} ${seq}`);
    assert.equal(
      expandGemma3ImageTokens("A<start_of_image>B<start_of_image>C", [1, 0], 2),
      `AHere is the original image ${seq} and here are some crops to help you see better ${seq}B${seq}C`,
    );
  });

  it("makes one feature per image and crop, each hashed with the pan-and-scan settings", () => {
    const encode = (s: string) => [...s].map((c) => (c === "#" ? 9 : 1)); // one id per character; '#' the image token
    const spec: Gemma3ImageInputSpec = { processor: { imageSize: 2, ...GEMMA3_IMAGE_DEFAULTS }, mmTokensPerImage: 1, imageTokenIndex: 9 };
    const textOf = (n: number) => gemma3ImageText(n, 1).replaceAll("<image_soft_token>", "#");
    const px = [new Float32Array(12).fill(1), new Float32Array(12).fill(2), new Float32Array(12).fill(3)];
    const enc = (s: string) => encode(s.replaceAll("<image_soft_token>", "#"));
    const p = gemma3ImagePrompt("x<start_of_image>y", [px], spec, enc);
    assert.equal(p.promptText, `x${gemma3ImageText(2, 1)}y`);
    const at = [...`x${textOf(2)}y`].flatMap((c, i) => (c === "#" ? [i] : []));
    assert.equal(at.length, 3);
    assert.deepEqual(p.features.map((f) => [f.offset, f.length, f.pixelValues[0]]), [[at[0], 1, 1], [at[1], 1, 2], [at[2], 1, 3]]);
    const other = gemma3ImagePrompt("x<start_of_image>y", [px], withMmProcessorKwargs(spec, { pan_and_scan_max_num_crops: 3 }), enc);
    assert.notEqual(other.features[0]!.hash, p.features[0]!.hash, "other settings, another cache key");
    assert.equal(gemma3ImagePrompt("x<start_of_image>y", [px], spec, enc).features[0]!.hash, p.features[0]!.hash);
  });

  it("checks mm_processor_kwargs: the four keys with their types; anything else an MmProcessorKwargsError naming the key", () => {
    assert.deepEqual(applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, { do_pan_and_scan: true, pan_and_scan_min_ratio_to_activate: 2 }), { ...ON, minRatioToActivate: 2 });
    assert.deepEqual(applyMmProcessorKwargs(ON, { do_pan_and_scan: null }), ON);
    const bad = (kwargs: unknown, key: string, re: RegExp) =>
      assert.throws(() => applyMmProcessorKwargs(PAN_AND_SCAN_DEFAULTS, kwargs), (e: unknown) => e instanceof MmProcessorKwargsError && e.key === key && re.test(e.message));
    bad({ num_crops: 2 }, "num_crops", /unknown key 'num_crops'/);
    bad({ do_pan_and_scan: "yes" }, "do_pan_and_scan", /must be a boolean/);
    bad({ pan_and_scan_min_crop_size: 1.5 }, "pan_and_scan_min_crop_size", /positive integer/);
    bad({ pan_and_scan_max_num_crops: 0 }, "pan_and_scan_max_num_crops", /positive integer/);
    bad({ pan_and_scan_min_ratio_to_activate: "1.2" }, "pan_and_scan_min_ratio_to_activate", /positive number/);
    bad([1], "", /JSON object/);
  });

  it("reads pan-and-scan from preprocessor_config.json (no longer refused), checking its values", () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-pas-"));
    writeFileSync(join(dir, "preprocessor_config.json"), JSON.stringify({ do_pan_and_scan: true, pan_and_scan_max_num_crops: 3, pan_and_scan_min_crop_size: null }));
    assert.deepEqual(readGemma3ImageProcessorConfig(dir, 56).panAndScan, { ...ON, maxNumCrops: 3 });
    writeFileSync(join(dir, "preprocessor_config.json"), JSON.stringify({ do_pan_and_scan: 1 }));
    assert.throws(() => readGemma3ImageProcessorConfig(dir, 56), (e: unknown) => e instanceof VisionConfigError && /do_pan_and_scan' must be a boolean/.test(e.message));
  });
});
