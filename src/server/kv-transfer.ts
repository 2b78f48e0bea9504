// P/D disaggregation over HTTP (vLLM's --kv-transfer-config and kv_transfer_params, NixlConnector's protocol; the
// engine side is engine/kv-transfer.ts). A prefill server's request with {"do_remote_decode": true} keeps its prompt's
// K/V when it finishes and answers with {"do_remote_prefill": true, "remote_host", "remote_port", "remote_request_id",
// ...}; the decode server given those params pulls the K/V from the prefill server's side channel (GET
// /kv/<remote_request_id>, like NIXL's side channel a port of its own) before it queues the request. A snapshot is
// served once (then dropped) and expires after `ttlMs` (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s) unread; a
// decode server that cannot fetch it computes the prompt itself, as vLLM's kv_load_failure_policy "recompute".
import { randomUUID } from "node:crypto";
import { createServer, request as httpRequest, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { decodeSnapshot, encodeSnapshot, KvTransferError, type KvSnapshot } from "../engine/kv-transfer.js";
import { badRequest } from "./errors.js";
import type { Json } from "./fields.js";

/** vLLM's KVTransferConfig, the fields Kiln reads. */
export interface KvTransferConfig {
  /** "KilnConnector"; vLLM's "NixlConnector" is taken as its name for the same role (peers must be Kiln servers). */
  kvConnector: string;
  /** kv_producer: prefills only; kv_consumer: decodes only; kv_both: either (vLLM's NixlConnector runs kv_both). */
  kvRole: "kv_producer" | "kv_consumer" | "kv_both";
  /** The address decode servers reach the side channel at (kv_ip; default 127.0.0.1). */
  kvIp: string;
  /** The side channel's port (kv_port; 0 or absent: any free port, reported in each remote_port). */
  kvPort: number;
  /** engine_id: names this server in remote_engine_id (default a random id). */
  engineId: string;
}

export const KV_CONNECTORS = ["KilnConnector", "NixlConnector"] as const;
const ROLES = ["kv_producer", "kv_consumer", "kv_both"] as const;

/** Parses --kv-transfer-config's JSON; throws Error naming the field that is wrong. */
export function parseKvTransferConfig(text: string): KvTransferConfig {
  let o: unknown;
  try {
    o = JSON.parse(text);
  } catch {
    throw new Error(`--kv-transfer-config must be JSON, got ${text}`);
  }
  if (o === null || typeof o !== "object" || Array.isArray(o)) throw new Error("--kv-transfer-config must be a JSON object");
  const c = o as Record<string, unknown>;
  const connector = c.kv_connector;
  if (!(KV_CONNECTORS as readonly unknown[]).includes(connector))
    throw new Error(`--kv-transfer-config: kv_connector must be one of ${KV_CONNECTORS.join(", ")} (K/V moves over Kiln's HTTP side channel), got ${JSON.stringify(connector)}`);
  const role = c.kv_role ?? "kv_both";
  if (!(ROLES as readonly unknown[]).includes(role)) throw new Error(`--kv-transfer-config: kv_role must be one of ${ROLES.join(", ")}, got ${JSON.stringify(role)}`);
  const ip = c.kv_ip ?? "127.0.0.1";
  if (typeof ip !== "string" || ip === "") throw new Error(`--kv-transfer-config: kv_ip must be a host name or address, got ${JSON.stringify(ip)}`);
  const port = c.kv_port ?? 0;
  if (!Number.isInteger(port) || (port as number) < 0 || (port as number) > 65535)
    throw new Error(`--kv-transfer-config: kv_port must be a port number, got ${JSON.stringify(port)}`);
  const engineId = c.engine_id ?? randomUUID();
  if (typeof engineId !== "string" || engineId === "") throw new Error(`--kv-transfer-config: engine_id must be a non-empty string`);
  return { kvConnector: connector as string, kvRole: role as KvTransferConfig["kvRole"], kvIp: ip, kvPort: port as number, engineId };
}

/** A request's kv_transfer_params as the handlers act on them. */
export type KvTransferRequest =
  | { kind: "export" }
  | { kind: "import"; host: string; port: number; requestId: string; engineId: string | null };

/** Reads kv_transfer_params (absent, null or neither flag set: null); 400 for params that cannot be acted on. */
export function parseKvTransferParams(body: Json, service: KvTransferService | null): KvTransferRequest | null {
  const v = body.kv_transfer_params;
  if (v === undefined || v === null) return null;
  const param = "kv_transfer_params";
  if (typeof v !== "object" || Array.isArray(v)) throw badRequest("'kv_transfer_params' must be an object", param);
  const p = v as Json;
  const decode = p.do_remote_decode === true, prefill = p.do_remote_prefill === true;
  if (!decode && !prefill) return null;
  if (service === null) throw badRequest("kv_transfer_params need a server started with --kv-transfer-config", param);
  if (decode && prefill) throw badRequest("'kv_transfer_params' cannot set both do_remote_decode and do_remote_prefill", param);
  const role = service.config.kvRole;
  if (decode) {
    if (role === "kv_consumer") throw badRequest("this server is a kv_consumer: it does not prefill for remote decode", param);
    if (body.stream === true) throw badRequest("a prefill for remote decode (do_remote_decode) cannot be streamed", param);
    return { kind: "export" };
  }
  if (role === "kv_producer") throw badRequest("this server is a kv_producer: it does not decode remote prefills", param);
  const host = p.remote_host, port = p.remote_port, id = p.remote_request_id;
  if (typeof host !== "string" || host === "") throw badRequest("do_remote_prefill needs 'remote_host'", param);
  if (!Number.isInteger(port) || (port as number) < 1 || (port as number) > 65535) throw badRequest("do_remote_prefill needs 'remote_port' (a port number)", param);
  if (typeof id !== "string" || !/^[A-Za-z0-9_-]{1,200}$/.test(id)) throw badRequest("do_remote_prefill needs 'remote_request_id' (what the prefill answered)", param);
  return { kind: "import", host, port: port as number, requestId: id, engineId: typeof p.remote_engine_id === "string" ? p.remote_engine_id : null };
}

interface Held {
  bytes: Uint8Array;
  expires: number;
}

/** The side channel and the snapshots it holds for decode servers. */
export class KvTransferService {
  private readonly held = new Map<string, Held>();
  private heldBytes = 0;
  private server: Server | null = null;
  private port = 0;
  private sweeper: NodeJS.Timeout | null = null;
  /** Counters for /metrics: snapshots served, expired unread, dropped for room; imports fetched and failed. */
  readonly counts = { exported: 0, served: 0, expired: 0, evicted: 0, imported: 0, importFailures: 0 };

  constructor(
    readonly config: KvTransferConfig,
    readonly model: string,
    private readonly options: { bindHost?: string; ttlMs?: number; maxHeldBytes?: number; warn?: (msg: string) => void } = {},
  ) {}

  /** Starts the side channel; resolves once it listens. */
  async start(): Promise<void> {
    const server = createServer((req, res) => {
      const m = /^\/kv\/([A-Za-z0-9_-]+)$/.exec(req.url ?? "");
      const held = m !== null && req.method === "GET" ? this.take(m[1]!) : undefined;
      if (held === undefined) {
        res.writeHead(404, { "content-type": "text/plain" }).end("no such K/V snapshot (never made, already read, or expired)\n");
        return;
      }
      this.counts.served++;
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": held.length }).end(held);
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.config.kvPort, this.options.bindHost ?? "0.0.0.0", () => resolve());
    });
    this.server = server;
    this.port = (server.address() as AddressInfo).port;
    this.sweeper = setInterval(() => this.sweep(Date.now()), 5_000).unref();
  }

  /** The side channel's port (the configured one, or the one the OS chose). */
  get sidePort(): number {
    return this.port;
  }

  /** Holds a finished prefill's snapshot and returns the kv_transfer_params a decode server needs to fetch it. */
  hold(snapshot: KvSnapshot, blockIds: number[] = []): Json {
    const id = randomUUID().replace(/-/g, "");
    const bytes = encodeSnapshot({ ...snapshot, model: this.model });
    const cap = this.options.maxHeldBytes ?? 1 << 30;
    for (const [k, h] of this.held) { // oldest first (insertion order)
      if (this.heldBytes + bytes.length <= cap) break;
      this.drop(k, h);
      this.counts.evicted++;
    }
    this.held.set(id, { bytes, expires: Date.now() + (this.options.ttlMs ?? 480_000) });
    this.heldBytes += bytes.length;
    this.counts.exported++;
    return {
      do_remote_prefill: true, do_remote_decode: false, remote_engine_id: this.config.engineId, remote_request_id: id,
      remote_block_ids: blockIds, remote_host: this.config.kvIp, remote_port: this.port, tp_size: 1,
    };
  }

  /**
   * Fetches a prefill server's snapshot; null (with a warning) when it cannot be had, and the request then computes
   * its prompt itself. 400 when it was made by another model than this server's.
   */
  async fetch(r: Extract<KvTransferRequest, { kind: "import" }>, signal?: AbortSignal): Promise<KvSnapshot | null> {
    let snapshot: KvSnapshot;
    try {
      snapshot = decodeSnapshot(await getBytes(r.host, r.port, `/kv/${r.requestId}`, signal));
    } catch (e) {
      this.counts.importFailures++;
      this.options.warn?.(`K/V of ${r.requestId} from ${r.host}:${r.port} not loaded (the prompt is computed here): ${(e as Error).message}`);
      return null;
    }
    if (snapshot.model !== this.model)
      throw badRequest(`the remote K/V was computed by model ${snapshot.model}, this server serves ${this.model}`, "kv_transfer_params");
    this.counts.imported++;
    return snapshot;
  }

  private take(id: string): Uint8Array | undefined {
    const h = this.held.get(id);
    if (h === undefined) return undefined;
    this.drop(id, h);
    return h.expires < Date.now() ? undefined : h.bytes;
  }

  private drop(id: string, h: Held): void {
    this.held.delete(id);
    this.heldBytes -= h.bytes.length;
  }

  private sweep(now: number): void {
    for (const [k, h] of this.held) if (h.expires < now) {
      this.drop(k, h);
      this.counts.expired++;
    }
  }

  /** Snapshots held now, and their bytes. */
  get holding(): { count: number; bytes: number } {
    return { count: this.held.size, bytes: this.heldBytes };
  }

  async close(): Promise<void> {
    if (this.sweeper !== null) clearInterval(this.sweeper);
    this.held.clear();
    this.heldBytes = 0;
    const s = this.server;
    this.server = null;
    if (s !== null) await new Promise<void>((resolve) => s.close(() => resolve()));
  }
}

/** GET http://host:port/path as bytes; rejects on a non-200 answer, a network error or `signal`. */
function getBytes(host: string, port: number, path: string, signal?: AbortSignal): Promise<Uint8Array> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host, port, path, method: "GET", timeout: 30_000, ...(signal ? { signal } : {}) }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () => {
        if (res.statusCode !== 200) reject(new KvTransferError(`the side channel answered ${res.statusCode}: ${Buffer.concat(chunks).toString("utf8").trim()}`));
        else resolve(new Uint8Array(Buffer.concat(chunks)));
      });
    });
    req.on("timeout", () => req.destroy(new KvTransferError("the side channel did not answer within 30 s")));
    req.on("error", reject);
    req.end();
  });
}

/** What a chat or completions handler does with a request's kv_transfer_params. */
export interface KvTransferPlan {
  kind: KvTransferRequest["kind"];
  /** The engine request's kvTransfer option (an import whose snapshot could not be had: none, the prompt is computed). */
  option: { export?: boolean; import?: KvSnapshot } | null;
}

/**
 * Reads the request's kv_transfer_params and, for a decode, fetches the prefill's K/V first; null when it has none.
 * A prefill for remote decode takes one prompt (its answer carries one kv_transfer_params).
 */
export async function planKvTransfer(service: KvTransferService | null, body: Json, numPrompts: number): Promise<KvTransferPlan | null> {
  const r = parseKvTransferParams(body, service);
  if (r === null) return null;
  if (r.kind === "export") {
    if (numPrompts !== 1) throw badRequest(`a prefill for remote decode takes one prompt, got ${numPrompts}`, "kv_transfer_params");
    return { kind: "export", option: { export: true } };
  }
  const snapshot = await service!.fetch(r);
  return { kind: "import", option: snapshot === null ? null : { import: snapshot } };
}

/**
 * The response's kv_transfer_params (vLLM's field): a prefill's are what its decode server needs (null when the
 * request ended without a snapshot, as an abort); a decode's are null. No field for requests without any.
 */
export function kvTransferField(service: KvTransferService | null, plan: KvTransferPlan | null, snapshot: KvSnapshot | undefined): Json {
  if (plan === null) return {};
  return { kv_transfer_params: plan.kind === "export" && snapshot !== undefined ? service!.hold(snapshot) : null };
}
