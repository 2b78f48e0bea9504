// `kiln serve --logits-processors`: a processor module loaded in the engine worker at start-up, steered per
// request by `vllm_xargs`; a bad specifier stops start-up with an error naming it.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as path from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { assertErrorBody, postRaw, startKiln, type KilnServer } from "../e2e/kiln-process.js";
import { writeBanTokenProcessor } from "../engine/ban-token-processor.js";
import { tinyModelDir } from "../helpers/tiny-model.js";

const root = fileURLToPath(new URL("../../..", import.meta.url)); // dist/test/server -> package root

describe("kiln serve --logits-processors", () => {
  let server: KilnServer;
  before(async () => {
    const file = writeBanTokenProcessor("serve-procs");
    // relative to the server's cwd (the package root), as a user would type it
    server = await startKiln(["--max-model-len", "128", "--logits-processors", `${path.relative(process.cwd(), file)}:BanToken`]);
  });
  after(async () => {
    assert.equal(await server.stop(), 0);
  });

  const complete = (extra: Record<string, unknown>) =>
    postRaw(server.url, "/v1/completions", {
      model: server.model,
      prompt: "The jury said",
      max_tokens: 8,
      temperature: 0,
      ignore_eos: true,
      ...extra,
    });

  it("vllm_xargs reaches the processor in the worker: the banned token never appears", { timeout: 60_000 }, async () => {
    const sampled = async (extra: Record<string, unknown>): Promise<string[]> => {
      const r = await complete({ logprobs: 1, ...extra });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return (r.body as { choices: { logprobs: { tokens: string[] } }[] }).choices[0]!.logprobs.tokens;
    };
    const free = await sampled({});
    const first = free[0]!;
    const ids = (await postRaw(server.url, "/tokenize", { prompt: first, add_special_tokens: false })).body as { tokens: number[] };
    assert.equal(ids.tokens.length, 1, `${JSON.stringify(first)} is one token`);
    const banned = await sampled({ vllm_xargs: { ban_token: ids.tokens[0]! } });
    assert.equal(banned.length, 8);
    assert.ok(!banned.includes(first), `${JSON.stringify(first)} appears in ${JSON.stringify(banned)}`);
    assert.deepEqual(await sampled({ vllm_xargs: { other: "x", list: [1, "a", true] } }), free, "unrelated xargs change nothing");
  });

  it("a wrongly typed vllm_xargs is a 400 naming it; a value the processor rejects is a 400 too", async () => {
    for (const bad of ["x", [1], { ban_token: { nested: 1 } }, { ban_token: [[1]] }]) {
      const r = await complete({ vllm_xargs: bad });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assertErrorBody(r.body, { type: "invalid_request_error", param: "vllm_xargs" });
    }
    const r = await complete({ vllm_xargs: { ban_token: "seven" } });
    assert.equal(r.status, 400, JSON.stringify(r.body));
    assertErrorBody(r.body, { type: "invalid_request_error", param: "extra_args", message: /ban_token must be a token id/ });
  });
});

describe("kiln serve --logits-processors with a bad specifier", () => {
  it("fails start-up with an error naming the specifier", { timeout: 60_000 }, () => {
    const r = spawnSync(
      process.execPath,
      [`${root}/bin/kiln`, "serve", tinyModelDir("LlamaForCausalLM"), "--port", "0", "--logits-processors", "./no-such-proc.mjs:P"],
      {
        encoding: "utf8",
        timeout: 50_000,
      },
    );
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /cannot load "\.\/no-such-proc\.mjs:P"/);
  });
});
