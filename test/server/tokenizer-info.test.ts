// GET /tokenizer_info (vLLM --enable-tokenizer-info-endpoint): the tokenizer's tokenizer_config.json settings, its
// class as transformers loads it and the served chat template; not served without the flag.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { Tokenizer } from "../../src/models/tokenizer.js";
import { testTokenizerDir } from "../helpers/tiny-model.js";
import { startTestServer } from "./helpers.js";

describe("GET /tokenizer_info", () => {
  it("answers tokenizer_config.json's settings, the fast class and the chat template", async () => {
    const dir = testTokenizerDir();
    const tokenizer = Tokenizer.fromDir(dir);
    const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")) as Record<string, unknown>;
    const s = await startTestServer({ tokenizer, tokenizerInfoEndpoint: true });
    try {
      const res = await fetch(`${s.url}/tokenizer_info`);
      assert.equal(res.status, 200);
      const info = (await res.json()) as Record<string, unknown>;
      assert.equal(info.bos_token, tokenizer.bosToken);
      assert.equal(info.eos_token, tokenizer.eosToken);
      assert.equal(info.chat_template, tokenizer.chatTemplate);
      const declared = typeof config.tokenizer_class === "string" ? config.tokenizer_class : "PreTrainedTokenizer";
      assert.equal(info.tokenizer_class, declared.endsWith("Fast") ? declared : `${declared}Fast`);
      for (const [k, v] of Object.entries(config)) if (k !== "tokenizer_class" && typeof v !== "object") assert.deepEqual(info[k], v, k);
    } finally {
      await s.close();
    }
  });

  it("a --chat-template is the one reported; without the flag the path is 404", async () => {
    const tokenizer = Tokenizer.fromDir(testTokenizerDir());
    const s = await startTestServer({ tokenizer, tokenizerInfoEndpoint: true, chatTemplate: "{{ messages[0].content }}" });
    try {
      assert.equal(((await (await fetch(`${s.url}/tokenizer_info`)).json()) as { chat_template: string }).chat_template, "{{ messages[0].content }}");
    } finally {
      await s.close();
    }
    const off = await startTestServer({ tokenizer });
    try {
      assert.equal((await fetch(`${off.url}/tokenizer_info`)).status, 404);
    } finally {
      await off.close();
    }
  });
});
