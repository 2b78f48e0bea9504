// vLLM's multimodal serve flags: --mm-processor-kwargs (checked, reaching the engine's arguments and the served image
// processor), --media-io-kwargs (image.rgba_background_color honoured, other image keys refused), --interleave-mm-strings
// and --disable-chunked-mm-input (declared; the latter a no-op: Kiln never splits an image between steps).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { servingArgsOf } from "../../src/cli/engine-factory.js";
import { addServeOptions, CliUsageError, parseServeArgs, type ServeArgs } from "../../src/cli/serve-args.js";
import { servedImageOptions } from "../../src/cli/serve.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { tinyGemma3VisionDir } from "../helpers/tiny-model.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/cli -> package root
const kiln = (...args: string[]) => spawnSync(`${root}/bin/kiln`, args, { encoding: "utf8", timeout: 10_000 });

/** The flags as commander reads them from a command line, then validated. */
function parseLine(model: string, ...words: string[]): ServeArgs {
  const cmd = addServeOptions(new Command().exitOverride());
  cmd.parse(words, { from: "user" });
  return parseServeArgs(model, cmd.opts(), {});
}

describe("vLLM multimodal serve flags", () => {
  it("--mm-processor-kwargs: JSON of Gemma 3's pan-and-scan keys, reaching the engine's arguments", () => {
    assert.equal(parseLine("org/m").mmProcessorKwargs, null);
    const a = parseLine("org/m", "--mm-processor-kwargs", '{"do_pan_and_scan": true, "pan_and_scan_max_num_crops": 2}');
    assert.deepEqual(a.mmProcessorKwargs, { do_pan_and_scan: true, pan_and_scan_max_num_crops: 2 });
    assert.deepEqual(servingArgsOf(a, () => undefined).mmProcessorKwargs, a.mmProcessorKwargs);
    const bad = (value: string, re: RegExp) => assert.throws(() => parseLine("org/m", "--mm-processor-kwargs", value), (e: unknown) => e instanceof CliUsageError && re.test(e.message));
    bad('{"num_crops": 2}', /--mm-processor-kwargs: unknown key 'num_crops'/);
    bad('{"do_pan_and_scan": "true"}', /--mm-processor-kwargs: 'do_pan_and_scan' must be a boolean/);
    bad("do_pan_and_scan=true", /--mm-processor-kwargs must be a JSON object/);
  });

  it("--mm-processor-kwargs sets the served model's image processor (pan-and-scan on)", async () => {
    const dir = tinyGemma3VisionDir();
    const tok = loadLocalModel(dir).tokenizer;
    const off = await servedImageOptions(parseLine(dir), tok);
    assert.equal(off.imageInput!.processor.panAndScan.doPanAndScan, false);
    const on = await servedImageOptions(parseLine(dir, "--mm-processor-kwargs", '{"do_pan_and_scan": true, "pan_and_scan_min_crop_size": 8}'), tok);
    assert.deepEqual(on.imageInput!.processor.panAndScan, { doPanAndScan: true, minCropSize: 8, maxNumCrops: 4, minRatioToActivate: 1.2 });
  });

  it("--media-io-kwargs: image.rgba_background_color (and image_mode RGB) taken, other image keys refused, other modalities warned of", () => {
    assert.equal(parseLine("org/m").mediaAccess.rgbaBackground, undefined); // (white)
    const a = parseLine("org/m", "--media-io-kwargs", '{"image": {"rgba_background_color": [0, 0, 0], "image_mode": "RGB"}}');
    assert.deepEqual(a.mediaAccess.rgbaBackground, [0, 0, 0]);
    const v = parseLine("org/m", "--media-io-kwargs", '{"video": {"num_frames": 40}}');
    assert.match(v.warnings.join("\n"), /--media-io-kwargs: no effect: Kiln takes images only, video kwargs are not read/);
    const bad = (value: string, re: RegExp) => assert.throws(() => parseLine("org/m", "--media-io-kwargs", value), (e: unknown) => e instanceof CliUsageError && re.test(e.message));
    bad('{"image": {"mode": "L"}}', /--media-io-kwargs: image.mode is not supported/);
    bad('{"image": {"image_mode": "L"}}', /image.image_mode "L" is not supported: images are read as RGB/);
    bad('{"image": {"rgba_background_color": [0, 0, 256]}}', /rgba_background_color must be three integers in 0..255/);
    bad('{"image": 1}', /--media-io-kwargs: image must map to an object/);
  });

  it("--interleave-mm-strings and --disable-chunked-mm-input are declared switches", () => {
    assert.equal(parseLine("org/m").interleaveMmStrings, false);
    const a = parseLine("org/m", "--interleave-mm-strings", "--disable-chunked-mm-input");
    assert.equal(a.interleaveMmStrings, true);
    assert.equal(servingArgsOf(a, () => undefined).interleaveMmStrings, true);
    assert.deepEqual(a.warnings, []);
  });

  it("a bad --mm-processor-kwargs is a usage error of kiln serve (exit 2)", () => {
    const r = kiln("serve", "m", "--mm-processor-kwargs", '{"do_pan_and_scan": 1}');
    assert.equal(r.status, 2);
    assert.match(r.stderr, /kiln: error: --mm-processor-kwargs: 'do_pan_and_scan' must be a boolean, got 1/);
  });
});
