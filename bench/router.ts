// Router bench: the latency and throughput the router adds in front of a worker, and cache_aware's cost per
// decision. Two stub workers (plain node:http on 127.0.0.1, answering JSON or a 32-chunk SSE stream at once) stand
// in for `kiln serve`, so what is measured is the router alone: request parse, routing text, tree walk and insert,
// the proxied exchange and the streamed copy back.
// Usage: node dist/bench/router.js [--requests 1000] [--concurrency 16]
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { CacheAwarePolicy, createRouter } from "../src/router/index.js";

function option(name: string, def: number): number {
  const i = process.argv.indexOf(name);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
}
const REQUESTS = option("--requests", 1000);
const CONCURRENCY = option("--concurrency", 16);

async function stubWorker(): Promise<{ url: string; server: http.Server }> {
  const server = http.createServer((req, res) => {
    let body = "";
    req.on("data", (d: Buffer) => (body += d.toString()));
    req.on("end", () => {
      if (req.url === "/health") return res.end();
      if (req.url === "/metrics") return res.end("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n");
      if (!(JSON.parse(body) as { stream?: boolean }).stream) return res.end(JSON.stringify({ choices: [{ text: "ok" }] }));
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (let i = 0; i < 32; i++) res.write(`data: {"i":${i}}\n\n`);
      res.end("data: [DONE]\n\n");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

const agent = new http.Agent({ keepAlive: true });
function post(base: string, body: unknown): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${base}/v1/completions`, { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
      res.resume();
      res.on("end", resolve);
    });
    req.on("error", reject);
    req.end(JSON.stringify(body));
  });
}

const prefix = "shared system prompt ".repeat(50); // ~1 KB shared by every request
const request = (i: number, stream: boolean) => ({ prompt: `${prefix}question ${i}`, max_tokens: 8, stream });

async function latency(base: string, stream: boolean): Promise<string> {
  const t: number[] = [];
  for (let i = 0; i < REQUESTS; i++) {
    const t0 = performance.now();
    await post(base, request(i, stream));
    t.push(performance.now() - t0);
  }
  t.sort((a, b) => a - b);
  return `p50 ${t[t.length >> 1]!.toFixed(3)} ms, p99 ${t[Math.floor(t.length * 0.99)]!.toFixed(3)} ms`;
}

async function throughput(base: string): Promise<string> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < REQUESTS * 4) await post(base, request(next++, false));
  }));
  return `${((REQUESTS * 4) / ((performance.now() - t0) / 1000)).toFixed(0)} req/s`;
}

const workers = await Promise.all([stubWorker(), stubWorker()]);
const router = createRouter({ workerUrls: workers.map((w) => w.url), port: 0, logLevel: "critical" }, { log: () => {} });
const url = await router.listen();
for (const stream of [false, true]) {
  await latency(workers[0]!.url, stream); // warm-up
  await latency(url, stream);
  console.log(`${stream ? "SSE " : "JSON"} sequential  direct: ${await latency(workers[0]!.url, stream)}   via router: ${await latency(url, stream)}`);
}
console.log(`JSON concurrency ${CONCURRENCY}  direct: ${await throughput(workers[0]!.url)}   via router: ${await throughput(url)}`);

const views = [0, 1, 2, 3].map((i) => ({ url: `w${i}`, load: 0, kvCacheUsage: null }));
const policy = new CacheAwarePolicy({ cacheThreshold: 0.3, balanceAbsThreshold: 64, balanceRelThreshold: 1.5, maxTreeSize: 1 << 26 });
const system = "x".repeat(1000);
const t0 = performance.now();
for (let i = 0; i < 10_000; i++) policy.select(views, `${system} user ${i} ${"y".repeat(1000)}`);
console.log(`cache_aware select on 2 KB texts sharing 1 KB: ${(((performance.now() - t0) / 10_000) * 1000).toFixed(1)} us each (tree: ${policy.tree.nodeCount()} nodes)`);

await router.close();
for (const w of workers) w.server.close();
agent.destroy();
