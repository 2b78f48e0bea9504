// A scriptable stand-in for a `kiln serve` worker (plain node:http on 127.0.0.1), for router tests that need to
// control timing and failures: /health, /metrics with vLLM's load gauges, /v1/models, and an echo of every POST.
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { after, afterEach } from "node:test";

export interface SeenRequest {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

export type Handler = (req: http.IncomingMessage, res: http.ServerResponse, body: string) => boolean | void | Promise<boolean | void>;

export interface FakeWorker {
  readonly name: string;
  readonly url: string;
  readonly seen: SeenRequest[];
  /** Status /health answers (200 by default). */
  healthStatus: number;
  /** vllm:num_requests_running reported by /metrics. */
  running: number;
  /** The model /v1/models lists. */
  model: string;
  /** Runs first for every request but /health and /metrics; returning true means it answered. */
  handler: Handler | null;
  /** Stops listening and drops every connection (a crashed worker). */
  kill(): Promise<void>;
}

/**
 * Starts a fake worker on 127.0.0.1 and a free port, or on `host` and `port`: service-discovery tests give each fake
 * pod its own loopback address (127.0.0.2, 127.0.0.3, ...) and one port, as pods share the workers' port.
 */
export async function startFakeWorker(name: string, { host = "127.0.0.1", port = 0 }: { host?: string; port?: number } = {}): Promise<FakeWorker> {
  const seen: SeenRequest[] = [];
  const worker: FakeWorker = {
    name, url: "", seen, healthStatus: 200, running: 0, model: "tiny", handler: null,
    kill: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = http.createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (d: string) => (body += d));
    req.on("end", () => {
      void (async () => {
        const path = req.url ?? "/";
        if (path === "/health") return res.writeHead(worker.healthStatus).end();
        if (path === "/metrics") {
          const labels = `{model_name="${worker.model}"}`;
          return res.end(`# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running${labels} ${worker.running}\n` +
            `vllm:num_requests_waiting${labels} 0\nvllm:kv_cache_usage_perc${labels} 0.25\n`);
        }
        seen.push({ method: req.method ?? "", path, headers: req.headers, body });
        if (worker.handler !== null && (await worker.handler(req, res, body)) === true) return;
        if (path === "/v1/models") {
          res.setHeader("content-type", "application/json");
          return res.end(JSON.stringify({ object: "list", data: [{ id: worker.model, object: "model", owned_by: name }] }));
        }
        res.writeHead(200, { "content-type": "application/json", "x-worker-name": name });
        res.end(JSON.stringify({ worker: name, path, body }));
      })();
    });
  });
  await new Promise<void>((resolve, reject) => server.once("error", reject).listen(port, host, resolve));
  (worker as { url: string }).url = `http://${host}:${(server.address() as AddressInfo).port}`;
  return worker;
}

/** A URL on 127.0.0.1 where nothing listens (a port just freed). */
export async function deadUrl(): Promise<string> {
  const s = http.createServer();
  await new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = (s.address() as AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

/** Reads one sample of a Prometheus text: the first line of `name` whose labels contain `labels`. */
export function sample(text: string, name: string, labels = ""): number | undefined {
  const line = text.split("\n").find((l) => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) && l.includes(labels));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1));
}

/** The kv_transfer_params a fake prefill worker answers with (vLLM's NixlConnector fields). */
export const fakeKvParams = (engine: string): Record<string, unknown> => ({
  do_remote_prefill: true, do_remote_decode: false, remote_engine_id: engine, remote_request_id: `cmpl-${engine}-0`,
  remote_block_ids: [3, 4, 5], remote_host: "127.0.0.1", remote_port: 40123, tp_size: 1,
});

/**
 * A fake prefill worker's handler: a one-token completion (chat.completion on /v1/chat/completions) carrying
 * `kv` as its top-level kv_transfer_params; `undefined` leaves the field out.
 */
export const prefillAnswer = (kv: unknown): Handler => (req, res) => {
  const chat = req.url === "/v1/chat/completions";
  const choice = chat ? { index: 0, message: { role: "assistant", content: "A" }, finish_reason: "length" } : { index: 0, text: "A", finish_reason: "length" };
  const answer = { id: "cmpl-p", object: chat ? "chat.completion" : "text_completion", model: "tiny", choices: [choice], ...(kv === undefined ? {} : { kv_transfer_params: kv }) };
  res.writeHead(200, { "content-type": "application/json", "x-phase": "prefill" }).end(JSON.stringify(answer));
  return true;
};

/** An event stream that writes `first`, then waits for release() before it ends with `last` (streaming tests). */
export function heldStream(first: string, last: string): { handler: Handler; release: () => void } {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  const handler: Handler = async (_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(first);
    await held;
    res.end(last);
    return true;
  };
  return { handler, release };
}

/** Lists whose routers are closed after each test and whose workers are killed after the file's tests. */
export function cleanedUp<R extends { close(): Promise<void> }>(): { routers: R[]; workers: FakeWorker[] } {
  const routers: R[] = [];
  const workers: FakeWorker[] = [];
  afterEach(() => Promise.all(routers.splice(0).map((r) => r.close())).then(() => undefined));
  after(() => Promise.all(workers.map((w) => w.kill().catch(() => undefined))).then(() => undefined));
  return { routers, workers };
}
