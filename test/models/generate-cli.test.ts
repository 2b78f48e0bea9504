// `kiln generate` end to end, per supported family: greedy text from the safetensors directory and from its
// F32 GGUF export must agree, repeat exactly, and match the in-process LLM token for token.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { LLM } from "../../src/engine/llm-engine.js";
import { hasGgufArchitecture } from "../../src/models/formats/gguf-mapping.js";
import { SUPPORTED_ARCHITECTURES } from "../../src/models/hf-config.js";
import { exportGguf } from "../../src/models/init-model.js";
import { tempPath, tinyModelDir } from "../helpers/tiny-model.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/models -> package root
const run = promisify(execFile);
const PROMPT = "The jury said";

/** Spawns `kiln generate` greedily; resolves with stdout (the completion plus a newline). */
async function kilnGenerate(model: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const args = ["generate", "--model", model, "--prompt", PROMPT, "--max-tokens", "32", "--temperature", "0"];
  try {
    const { stdout } = await run(`${root}/bin/kiln`, args, { encoding: "utf8", timeout: 30_000, env });
    return stdout;
  } catch (e) {
    // name the exit status or signal (a crash at exit still printed the text)
    const { code, signal, stdout } = e as { code?: number; signal?: string; stdout?: string };
    Object.assign(e as Error, { message: `kiln generate --model ${model}: exit ${code ?? signal}, stdout ${JSON.stringify(stdout)}\n${(e as Error).message}` });
    throw e;
  }
}

function llmGreedy(model: string): { text: string; tokenIds: number[] } {
  const llm = new LLM({ model, maxModelLen: 256 });
  const [out] = llm.generate([PROMPT], { temperature: 0, maxTokens: 32 });
  const { text, tokenIds } = out!.outputs[0]!;
  return { text, tokenIds: [...tokenIds] };
}

for (const arch of SUPPORTED_ARCHITECTURES.filter(hasGgufArchitecture)) {
  test(`kiln generate: ${arch} greedy text is the same from safetensors and GGUF, and matches LLM`, { timeout: 60_000 }, async () => {
    const dir = tinyModelDir(arch);
    const gguf = tempPath(`${arch}-cli.gguf`);
    if (!fs.existsSync(gguf)) exportGguf(dir, gguf, "F32");
    // the Llama run is repeated to check that two processes print the same text
    const runs = arch === "LlamaForCausalLM" ? [dir, gguf, dir] : [dir, gguf];
    const [fromDir, fromGguf, again] = await Promise.all(runs.map((m) => kilnGenerate(m)));
    const ref = llmGreedy(dir);
    assert.ok(ref.tokenIds.length > 0, "no tokens generated");
    assert.equal(fromDir, `${ref.text}\n`);
    assert.equal(fromGguf, fromDir);
    if (again !== undefined) assert.equal(again, fromDir);
    assert.deepEqual(llmGreedy(gguf).tokenIds, ref.tokenIds);
  });
}

test("kiln generate: an uncached hub id offline fails with a message naming where it looked", { timeout: 30_000 }, async () => {
  const cache = tempPath("empty-hub-cache");
  fs.mkdirSync(cache, { recursive: true });
  const env = { ...process.env, HF_HUB_OFFLINE: "1", HF_HUB_CACHE: cache };
  await assert.rejects(kilnGenerate("kiln-test/not-a-model", env), (e: { code?: number; stderr?: string }) => {
    assert.notEqual(e.code, 0);
    assert.match(e.stderr ?? "", /kiln: error: .*not cached/);
    assert.ok(e.stderr!.includes(`${cache}/models--kiln-test--not-a-model`), e.stderr);
    return true;
  });
});
