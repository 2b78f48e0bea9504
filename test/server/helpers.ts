// Starts a Kiln server on an ephemeral port over the fake engine, plus an official OpenAI client for it.
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import { createServer, type ServerOptions } from "../../src/server/index.js";
import { FakeEngine, type FakeEngineOptions } from "./fake-engine.js";

export const MODEL = "kiln-test";

export interface TestServer {
  app: FastifyInstance;
  engine: FakeEngine;
  url: string; // http://127.0.0.1:PORT
  client: OpenAI;
  close(): Promise<void>;
}

export async function startTestServer(
  overrides: Partial<ServerOptions> = {}, engineOptions: FakeEngineOptions = {},
): Promise<TestServer> {
  const engine = new FakeEngine(engineOptions);
  const app = createServer({
    engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL, "alias"], maxModelLen: engine.maxModelLen, version: "0.1.0-test",
    ...overrides,
  });
  await app.listen({ port: 0, host: "127.0.0.1" });
  const addr = app.server.address();
  if (addr === null || typeof addr === "string") throw new Error("no port");
  const url = `http://127.0.0.1:${addr.port}`;
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: overrides.apiKey ?? "unused", maxRetries: 0 });
  const close = async (): Promise<void> => {
    const closing = app.close();
    app.server.closeAllConnections(); // undici may hold a fresh, request-less socket open for its 4 s keep-alive
    await closing;
  };
  return { app, engine, url, client, close };
}

/** Reads one sample of a metric from Prometheus text (first match of name + optional label substring). */
export function metricValue(text: string, name: string, labelSubstring = ""): number | undefined {
  for (const line of text.split("\n")) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) {
      if (labelSubstring && !line.includes(labelSubstring)) continue;
      return Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return undefined;
}

export async function freeBlocks(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return metricValue(text, "kiln:kv_cache_free_blocks")!;
}

/** Polls `cond` until it holds; the default timeout allows for a loaded 2-core machine (a passing wait ends early). */
export async function waitFor(cond: () => Promise<boolean> | boolean, timeoutMs = 10_000): Promise<void> {
  const start = Date.now();
  while (!(await cond())) {
    if (Date.now() - start > timeoutMs) throw new Error("waitFor: timed out");
    await new Promise((r) => setTimeout(r, 10));
  }
}
