// A real `kiln serve` under fifty concurrent streaming clients (a fifth abort midway), then SIGTERM mid-stream.
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import OpenAI from "openai";
import { startKiln, type KilnServer } from "./kiln-process.js";

let server: KilnServer;
let client: OpenAI;
type Streaming = OpenAI.CompletionCreateParamsStreaming & { ignore_eos?: boolean };
const PROMPTS = ["The river ran", "Once upon a time", "In the morning the", "She said that", "It was a dark"];
const LENGTHS = [16, 24, 32];

before(async () => {
  server = await startKiln();
  client = server.client();
});
after(async () => {
  await server.stop();
});

/** Deterministic pseudo-random numbers in [0, 1) (mulberry32), so that a failure replays the same schedule. */
function rng(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), seed | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function pollUntil(read: () => Promise<number>, want: number, timeoutMs = 5000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let got = await read();
  while (got !== want && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    got = await read();
  }
  return got;
}

function withDeadline<T>(p: Promise<T>, ms: number, describe: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(describe())), ms)));
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer));
}

interface StreamResult {
  text: string;
  finish: string | null;
  usage: OpenAI.CompletionUsage | null;
  aborted: boolean;
  chunks: number;
}

describe("kiln serve under load, and graceful shutdown (e2e)", () => {
  it("50 concurrent streams, 10 aborted at random points: the rest finish intact, the KV pool is whole again", async () => {
    const freeAtStart = await server.metric("kiln:kv_cache_free_blocks");
    assert.ok(freeAtStart > 0);
    assert.equal(freeAtStart, await server.metric("kiln:kv_cache_total_blocks"));
    const abortsAtStart = await server.metric("vllm:request_success_total", 'finished_reason="abort"');
    // Reference texts: greedy, one request at a time.
    const reference = new Map<string, string>();
    for (const prompt of PROMPTS) {
      for (const maxTokens of LENGTHS) {
        const r = await client.completions.create({ model: server.model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming);
        reference.set(`${prompt}|${maxTokens}`, r.choices[0]!.text);
      }
    }

    const random = rng(1234);
    const jobs = Array.from({ length: 50 }, (_, i) => {
      const prompt = PROMPTS[i % PROMPTS.length]!;
      const length = LENGTHS[Math.floor(random() * LENGTHS.length)]!;
      const abort = i % 5 === 2; // ten clients give up
      // a client that gives up asks for a long reply: on a loaded machine a short one could end before the abort
      // reached the server (which then sees a finished request, not an aborted one)
      const maxTokens = abort ? 400 : length;
      const afterChunks = Math.floor(random() * 6); // 0 = before the first chunk is read
      const afterMs = Math.floor(random() * 40);
      return { prompt, maxTokens, abort, byTimer: abort && i % 2 === 0, afterChunks, afterMs };
    });
    const stages: string[] = jobs.map(() => "queued");
    const run = async (job: (typeof jobs)[number], i: number): Promise<StreamResult> => {
      const controller = new AbortController();
      const result: StreamResult = { text: "", finish: null, usage: null, aborted: false, chunks: 0 };
      if (job.byTimer) setTimeout(() => controller.abort(), job.afterMs);
      try {
        stages[i] = "requesting";
        const stream = await client.completions.create(
          { model: server.model, prompt: job.prompt, max_tokens: job.maxTokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } } as Streaming,
          { signal: controller.signal },
        );
        for await (const chunk of stream) {
          if (job.abort && !job.byTimer && result.chunks === job.afterChunks) controller.abort();
          // A client that gives up stops reading. (Node 20's fetch never settles a read made after an abort once
          // the whole body had arrived, so reading on would hang the test, not the server.)
          if (controller.signal.aborted) break;
          result.chunks++;
          stages[i] = `read ${result.chunks} chunks, aborted=${controller.signal.aborted}`;
          if (chunk.usage) result.usage = chunk.usage;
          for (const c of chunk.choices) {
            result.text += c.text;
            if (c.finish_reason !== null) result.finish = c.finish_reason;
          }
        }
      } catch (err) {
        // Aborted before the response arrived; once streaming, the client's iterator just ends instead.
        assert.ok(err instanceof OpenAI.APIUserAbortError, `an abort ends the stream as a user abort, got ${String(err)}`);
      }
      result.aborted = controller.signal.aborted && result.finish === null; // a late timer may fire after the end
      assert.ok(job.abort || !controller.signal.aborted);
      return result;
    };
    // A stuck client fails the test (naming the job and how far it got) instead of hanging the file.
    const results = await Promise.all(jobs.map((job, i) => withDeadline(run(job, i), 30_000, () => `stream ${i} ${JSON.stringify(job)} stuck: ${stages[i]}`)));

    let completed = 0;
    results.forEach((r, i) => {
      const job = jobs[i]!;
      if (r.aborted) {
        assert.equal(r.finish, null, "an aborted stream has no finish_reason");
        assert.equal(r.usage, null);
        return;
      }
      completed++;
      assert.equal(r.finish, "length", `stream ${i}`);
      assert.equal(r.usage?.completion_tokens, job.maxTokens, `stream ${i}`);
      assert.equal(r.text, reference.get(`${job.prompt}|${job.maxTokens}`), `stream ${i} equals its sequential greedy text`);
    });
    assert.ok(completed >= 40, `${completed} streams completed`);
    const aborted = results.filter((r) => r.aborted).length;
    assert.ok(aborted >= 5, `${aborted} of 10 aborting clients actually aborted mid-stream`);

    // Every block comes back, nothing is left running or waiting, and the aborts were seen by the engine.
    assert.equal(await pollUntil(() => server.metric("kiln:kv_cache_free_blocks"), freeAtStart), freeAtStart);
    assert.equal(await server.metric("vllm:num_requests_running"), 0);
    assert.equal(await server.metric("vllm:num_requests_waiting"), 0);
    const abortsSeen = (await server.metric("vllm:request_success_total", 'finished_reason="abort"')) - abortsAtStart;
    assert.ok(abortsSeen >= 1 && abortsSeen <= aborted, `engine aborts ${abortsSeen}, client aborts ${aborted}`);
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
  });

  it("SIGTERM mid-stream: the stream completes, new requests are refused, the process exits 0", async () => {
    const reference = (await client.completions.create({ model: server.model, prompt: "The river ran", max_tokens: 200, temperature: 0, ignore_eos: true } as OpenAI.CompletionCreateParamsNonStreaming)).choices[0]!.text;
    const stream = await client.completions.create(
      { model: server.model, prompt: "The river ran", max_tokens: 200, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } } as Streaming,
    );
    const it = stream[Symbol.asyncIterator]();
    const first = await it.next();
    assert.equal(first.done, false);
    let text = first.value.choices[0]?.text ?? "";
    process.kill(server.pid, "SIGTERM");
    await new Promise((r) => setTimeout(r, 100)); // the signal handler has run: the listener is closing

    const late = await fetch(`${server.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: "x", max_tokens: 2 }) })
      .then((r) => r.status, () => "refused");
    assert.ok(late === 503 || late === "refused", `a request after SIGTERM got ${late}`);

    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | null = null;
    for (let r = await it.next(); !r.done; r = await it.next()) {
      if (r.value.usage) usage = r.value.usage;
      for (const c of r.value.choices) {
        text += c.text;
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, "length");
    assert.equal(usage?.completion_tokens, 200);
    assert.equal(text, reference);
    assert.equal(await server.exited, 0);
    assert.match(server.log(), /Received SIGTERM: draining 1 in-flight request\(s\)/);
    assert.match(server.log(), /Server stopped/);
  });
});
