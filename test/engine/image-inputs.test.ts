// Image inputs through the engine (Gemma3ForConditionalGeneration): an image's features replace the input
// embeddings at its <image_soft_token> positions and its tokens attend to each other both ways (HF's token_type_ids
// mask, vLLM's mm-prefix attention), against a dense forward of the same model with the features put there and the
// mask written by hand; chunked prefill (never splitting an image) and step graphs give the same logits; the prefix
// cache keys image blocks by the image's content hash (two images never share K/V, the same image hits).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { LLM, type PromptInput } from "../../src/engine/llm-engine.js";
import type { MultiModalFeature } from "../../src/engine/model-runner.js";
import { loadLocalModel } from "../../src/models/loader.js";
import { gemma3ImagePrompt, gemma3PixelValues, GEMMA3_IMAGE_DEFAULTS, type Gemma3ImageInputSpec } from "../../src/models/gemma3-image-processor.js";
import { logSoftmax, noGrad, tensor } from "../../src/tensor/index.js";
import { mulberry32 } from "../../src/util/random.js";
import { tinyGemma3VisionDir } from "../helpers/tiny-model.js";

/** A random RGB image's pixel_values at 56 pixels. */
function randomPixels(seed: number): Float32Array {
  const u = mulberry32(seed);
  const data = Uint8Array.from({ length: 20 * 30 * 3 }, () => Math.floor(u() * 256));
  return gemma3PixelValues({ width: 20, height: 30, data }, { imageSize: 56, ...GEMMA3_IMAGE_DEFAULTS });
}

describe("image inputs (Gemma 3)", () => {
  const dir = tinyGemma3VisionDir();
  const loaded = loadLocalModel(dir);
  const tok = loaded.tokenizer;
  const spec: Gemma3ImageInputSpec = {
    processor: { imageSize: 56, ...GEMMA3_IMAGE_DEFAULTS }, mmTokensPerImage: 4, imageTokenIndex: tok.encode("<image_soft_token>", { addSpecialTokens: false })[0]!,
  };
  const text = tok.applyChatTemplate(
    [{ role: "user", content: null, contentParts: [{ type: "text", text: "Describe the picture in a few words, please." }, { type: "image" }, { type: "text", text: "And say what the colors are." }] }],
    { contentFormat: "openai" },
  );
  const prompt = (pixels: Float32Array): { promptTokenIds: number[]; mmFeatures: MultiModalFeature[] } => {
    const p = gemma3ImagePrompt(text, [[pixels]], spec, (s) => tok.encode(s, { addSpecialTokens: false }));
    return { promptTokenIds: p.promptTokenIds, mmFeatures: p.features };
  };
  const [imgA, imgB] = [randomPixels(1), randomPixels(2)];
  const firstLogprobs = (llm: LLM, p: PromptInput) => {
    const [out] = llm.generate([p], { maxTokens: 1, temperature: 0, logprobs: 5 });
    return { lp: out!.outputs[0]!.logprobs![0]!, cached: out!.numCachedTokens };
  };

  it("loads the vision tower from both checkpoint layouts, or not at all when asked", () => {
    assert.ok(loaded.vision !== undefined);
    const fresh = loadLocalModel(tinyGemma3VisionDir("new"));
    assert.deepEqual(Array.from(fresh.vision!.encode(imgA)), Array.from(loaded.vision!.encode(imgA))); // same seed, same weights
    assert.equal(loadLocalModel(dir, { loadVision: false }).vision, undefined);
  });

  it("the prompt: the template's <start_of_image> expanded, one run of image tokens at the feature's positions", () => {
    assert.ok(text.includes("please.<start_of_image>And"));
    const p = prompt(imgA);
    const f = p.mmFeatures![0]!;
    assert.equal(f.length, 4);
    assert.deepEqual(p.promptTokenIds.slice(f.offset, f.offset + 4), [spec.imageTokenIndex, spec.imageTokenIndex, spec.imageTokenIndex, spec.imageTokenIndex]);
    assert.equal(tok.decode(p.promptTokenIds.slice(f.offset - 1, f.offset + 5), { skipSpecialTokens: false }), "<start_of_image><image_soft_token><image_soft_token><image_soft_token><image_soft_token><end_of_image>");
  });

  it("replaces the image tokens' input embeddings by the image's features, attending both ways within the image (a dense forward as the reference)", () => {
    const p = prompt(imgA);
    const f = p.mmFeatures![0]!;
    const dense = (spans: [number, number][]) => noGrad(() => {
      const T = p.promptTokenIds.length;
      const ids = tensor(Int32Array.from(p.promptTokenIds));
      const positions = tensor(Int32Array.from({ length: T }, (_, i) => i));
      const rows = tensor(Int32Array.from({ length: 4 }, (_, i) => f.offset + i));
      const values = tensor(loaded.vision!.encode(imgA), { shape: [4, loaded.config.hiddenSize] });
      const h = loaded.model.forward(ids, { kind: "dense", batch: 1, seqLen: T, positions, bidirectionalSpans: spans }, undefined, { rows, values });
      const logits = loaded.model.logits(h, Int32Array.of(T - 1));
      return logSoftmax(logits, -1).dataSync() as Float32Array;
    });
    const want = dense([[f.offset, f.offset + 4]]);
    const causal = dense([]);
    assert.ok(want.some((x, i) => Math.abs(x - causal[i]!) > 1e-3), "the image's bidirectional mask changes the logits");
    const llm = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true, enablePrefixCaching: false });
    const { lp } = firstLogprobs(llm, p);
    for (const [id, e] of lp) assert.ok(Math.abs(e.logprob - want[id]!) < 1e-4, `token ${id}: ${e.logprob} vs ${want[id]}`);
    // a text-only run of the same token ids (image tokens embedded as tokens) differs
    const { lp: plain } = firstLogprobs(llm, { promptTokenIds: p.promptTokenIds });
    assert.notDeepEqual([...plain.values()].map((e) => e.logprob), [...lp.values()].map((e) => e.logprob));
  });

  it("chunked prefill (a chunk boundary moved before the image, never inside) and step graphs give the same logits as one eager step", () => {
    const p = prompt(imgA);
    const offset = p.mmFeatures[0]!.offset;
    // a budget whose chunk boundaries fall inside the image (the runner refuses a step that splits one)
    const budget = [5, 6, 7, 8, 9, 10, 11, 12, 13].find((b) => Math.floor(offset / b) !== Math.floor((offset + 3) / b))!;
    const eager = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true, enablePrefixCaching: false });
    const chunked = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, maxNumBatchedTokens: budget, enablePrefixCaching: false, maxCaptureTokens: 8 });
    const a = firstLogprobs(eager, p).lp, b = firstLogprobs(chunked, p).lp;
    assert.deepEqual([...a.keys()], [...b.keys()]);
    for (const [id, e] of a) assert.ok(Math.abs(e.logprob - b.get(id)!.logprob) < 1e-4);
    // and greedy continuations agree token for token (decode steps replay graphs)
    const [x] = eager.generate([p], { maxTokens: 6, temperature: 0 });
    const [y] = chunked.generate([p], { maxTokens: 6, temperature: 0 });
    assert.deepEqual(y!.outputs[0]!.tokenIds, x!.outputs[0]!.tokenIds);
  });

  it("prefix caching keys image blocks by the image: another image never shares K/V, the same image hits", () => {
    const llm = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4, enablePrefixCaching: true, enforceEager: true });
    const pa = prompt(imgA), pb = prompt(imgB);
    assert.deepEqual(pa.promptTokenIds, pb.promptTokenIds); // same text, same tokens: only the image tells them apart
    const offset = pa.mmFeatures![0]!.offset;
    const first = firstLogprobs(llm, pa);
    const other = firstLogprobs(llm, pb);
    // B reads from the cache only the whole blocks before A's image
    assert.equal(other.cached, Math.floor(offset / 4) * 4);
    assert.notDeepEqual([...other.lp.values()].map((e) => e.logprob), [...first.lp.values()].map((e) => e.logprob));
    const fresh = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, blockSize: 4, enablePrefixCaching: false, enforceEager: true });
    const bAlone = firstLogprobs(fresh, pb).lp;
    for (const [id, e] of bAlone) assert.ok(Math.abs(e.logprob - other.lp.get(id)!.logprob) < 1e-4);
    // A again: every whole block of its prompt but the last token's comes from the cache, with A's logits
    const again = firstLogprobs(llm, pa);
    assert.equal(again.cached, Math.floor((pa.promptTokenIds.length - 1) / 4) * 4);
    for (const [id, e] of first.lp) assert.ok(Math.abs(e.logprob - again.lp.get(id)!.logprob) < 1e-4);
  });

  it("refuses images for a runner that reads text only, and an image longer than a step", () => {
    const llm = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true, limitMmPerPrompt: { image: 0 } });
    assert.throws(() => llm.generate([prompt(imgA)], { maxTokens: 1 }), /At most 0 image\(s\)/);
    const small = new LLM({ model: dir, maxModelLen: 128, kvCacheMemory: 2 << 20, enforceEager: true, maxNumBatchedTokens: 3 });
    assert.throws(() => small.generate([prompt(imgA)], { maxTokens: 1 }), /an image of 4 tokens is computed in one step, which takes at most 3 tokens/);
  });
});
