// `kiln run-batch` (vLLM's `vllm run-batch`): OpenAI's batch file format run offline. Each line of the input (a
// file, or an http(s) URL read with GET) is {"custom_id", "method": "POST", "url", "body"}; every request goes to
// the server's own route, in this process and without a socket (fastify's inject), so it is validated and answered
// exactly as over HTTP, and all of them are submitted at once for the engine to batch. The output (a file, or a URL
// written with PUT) has one line per input line, in input order: {"id", "custom_id", "response": {"status_code",
// "request_id", "body"}, "error"}, the error being the server's error object (body null) when the request failed.
import { randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { EngineFactory } from "./engine-factory.js";
import { createProgress } from "./progress.js";
import { CliUsageError, type ServeArgs } from "./serve-args.js";
import { servedImageOptions, serverEngineOptions, writesHarmony } from "./serve.js";
import { KILN_VERSION } from "./version.js";

export interface RunBatchOptions {
  inputFile: string;
  outputFile: string;
  /** Serve GET /metrics (Prometheus) on metricsHost:metricsPort while the batch runs (vLLM's --enable-metrics). */
  enableMetrics: boolean;
  metricsHost: string;
  metricsPort: number;
}

/** One input line, checked. */
export interface BatchRequestInput {
  custom_id: string;
  method: "POST";
  url: string;
  body: Record<string, unknown>;
}

/** One output line (vLLM's BatchRequestOutput). */
export interface BatchRequestOutput {
  id: string;
  custom_id: string;
  response: { status_code: number; request_id: string; body: unknown };
  error: unknown;
}

/** The routes a batch line may name (the completions and pooling endpoints; /score and /rerank with or without /v1). */
const SUPPORTED = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/score", "/rerank"];
const supported = (url: string): boolean => SUPPORTED.slice(0, 3).includes(url) || url.endsWith("/score") || url.endsWith("/rerank");

/** The input's lines as requests; a line that is not one is a usage error naming it (before any model is loaded). */
export function parseBatchInput(text: string, source: string): BatchRequestInput[] {
  const out: BatchRequestInput[] = [];
  const lines = text.split("\n");
  for (const [i, raw] of lines.entries()) {
    const line = raw.trim();
    if (line === "") continue;
    const where = `${source} line ${i + 1}`;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw new CliUsageError(`${where} is not JSON: ${(e as Error).message}`);
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new CliUsageError(`${where} must be a JSON object`);
    const o = v as Record<string, unknown>;
    if (typeof o.custom_id !== "string") throw new CliUsageError(`${where}: 'custom_id' must be a string`);
    if (o.method !== "POST") throw new CliUsageError(`${where}: 'method' must be "POST", got ${JSON.stringify(o.method)}`);
    if (typeof o.url !== "string" || !o.url.startsWith("/")) throw new CliUsageError(`${where}: 'url' must be a path such as /v1/chat/completions`);
    if (typeof o.body !== "object" || o.body === null || Array.isArray(o.body)) throw new CliUsageError(`${where}: 'body' must be a JSON object`);
    out.push({ custom_id: o.custom_id, method: "POST", url: o.url, body: o.body as Record<string, unknown> });
  }
  return out;
}

const isUrl = (s: string): boolean => /^https?:\/\//.test(s);
const hex = (): string => randomBytes(16).toString("hex");

async function readInput(source: string): Promise<string> {
  if (!isUrl(source)) {
    try {
      return readFileSync(source, "utf8");
    } catch (e) {
      throw new CliUsageError(`--input-file ${source} cannot be read: ${(e as Error).message}`);
    }
  }
  const res = await fetch(source).catch((e: Error) => {
    throw new CliUsageError(`--input-file ${source} cannot be fetched: ${e.message}`);
  });
  if (!res.ok) throw new CliUsageError(`--input-file ${source}: GET answered ${res.status}`);
  return res.text();
}

async function writeOutput(target: string, text: string): Promise<void> {
  if (!isUrl(target)) {
    writeFileSync(target, text);
    return;
  }
  const res = await fetch(target, { method: "PUT", body: text, headers: { "content-type": "application/jsonl" } });
  if (!res.ok) throw new Error(`--output-file ${target}: PUT answered ${res.status}`);
}

function errorLine(req: BatchRequestInput, status: number, error: unknown): BatchRequestOutput {
  return { id: `kiln-${hex()}`, custom_id: req.custom_id, response: { status_code: status, request_id: `kiln-batch-${hex()}`, body: null }, error };
}

/** Runs the batch; resolves with the output lines (also written to opts.outputFile). */
export async function runBatch(args: ServeArgs, opts: RunBatchOptions, factory: EngineFactory, log: NodeJS.WritableStream = process.stderr): Promise<BatchRequestOutput[]> {
  if (!isUrl(opts.outputFile) && opts.outputFile.trim() === "") throw new CliUsageError("--output-file must name a file or an http(s) URL");
  const requests = parseBatchInput(await readInput(opts.inputFile), opts.inputFile);
  const progress = createProgress();
  const [{ prepareServer }, loaded] = await Promise.all([import("../server/index.js"), factory(args, progress)]);
  progress.done();
  let metrics: Server | null = null;
  try {
    const server = prepareServer({ version: KILN_VERSION });
    const names = args.servedModelName ?? [loaded.modelName];
    // gpt-oss is read and written in Harmony format, and an image-text model takes images, as kiln serve serves them
    const images = await servedImageOptions(args, loaded.tokenizer);
    const app = server.bind({ ...serverEngineOptions(args, loaded, names, null, null, await writesHarmony(args)), ...images });
    await app.ready();
    if (opts.enableMetrics) {
      metrics = createServer((req, res) => {
        if (req.method !== "GET" || req.url?.split("?")[0] !== "/metrics") {
          res.writeHead(404).end();
          return;
        }
        void app.inject({ method: "GET", url: "/metrics" }).then((r) => res.writeHead(r.statusCode, { "content-type": String(r.headers["content-type"] ?? "text/plain") }).end(r.body));
      });
      await new Promise<void>((resolve, reject) => metrics!.once("error", reject).listen(opts.metricsPort, opts.metricsHost, resolve));
      log.write(`kiln run-batch: metrics at http://${opts.metricsHost}:${(metrics.address() as { port: number }).port}/metrics\n`);
    }
    let done = 0;
    const run = async (req: BatchRequestInput): Promise<BatchRequestOutput> => {
      try {
        if (!supported(req.url))
          return errorLine(req, 400, `URL ${req.url} was used. Supported endpoints: ${SUPPORTED.join(", ")}.`);
        if (req.body.stream === true) return errorLine(req, 400, "Request must not be sent in stream mode");
        const res = await app.inject({ method: "POST", url: req.url, payload: req.body, headers: { "content-type": "application/json" } });
        const body: unknown = JSON.parse(res.body);
        if (res.statusCode !== 200) return errorLine(req, res.statusCode, body);
        return { id: `kiln-${hex()}`, custom_id: req.custom_id, response: { status_code: 200, request_id: `kiln-batch-${hex()}`, body }, error: null };
      } finally {
        done++;
        if (done === requests.length || done % 100 === 0) log.write(`kiln run-batch: ${done}/${requests.length} requests done\n`);
      }
    };
    const outputs = await Promise.all(requests.map(run));
    await writeOutput(opts.outputFile, outputs.map((o) => JSON.stringify(o)).join("\n") + (outputs.length > 0 ? "\n" : ""));
    const failed = outputs.filter((o) => o.error !== null).length;
    log.write(`kiln run-batch: wrote ${outputs.length} results to ${opts.outputFile}${failed > 0 ? ` (${failed} failed)` : ""}\n`);
    return outputs;
  } finally {
    if (metrics !== null) await new Promise((resolve) => metrics!.close(resolve));
    await loaded.close();
  }
}
