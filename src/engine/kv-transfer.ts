// Prefill/decode disaggregation (vLLM's KV connector, NixlConnector's protocol): a prefill engine runs a request's
// prompt, and when it finishes copies the prompt's K/V out of its paged cache (a KvSnapshot); a decode engine given
// that snapshot writes it into the blocks it allocates for the same prompt and computes only what is left (at least
// the last prompt token, whose logits give the first sampled token). vLLM pulls blocks device to device (NIXL); here
// the snapshot is bytes that the server moves over HTTP (server/kv-transfer-server.ts).
// The layout is the KV cache's own: bytes, not values, so every cache dtype (f32, bf16, fp8) moves exactly.

/** What must match between two engines for one's K/V to be read by the other. */
export interface KvLayout {
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  /** The cache's element type ("float32", "bfloat16", "fp8_e4m3", "fp8_e5m2"). */
  dtype: string;
  /** Bytes of one token's K (or V) in one layer: numKvHeads * headDim * element size. */
  rowBytes: number;
}

/**
 * The K/V of a prompt's first `tokenIds.length` tokens: data is [layer][k, v][token][rowBytes]. `lora` names the
 * adapter that computed it (its projections change K/V), `model` the served model.
 */
export interface KvSnapshot {
  layout: KvLayout;
  tokenIds: number[];
  model: string;
  lora: string | null;
  data: Uint8Array;
}

/** Bytes a snapshot of `numTokens` tokens holds. */
export function snapshotBytes(layout: KvLayout, numTokens: number): number {
  return layout.numLayers * 2 * numTokens * layout.rowBytes;
}

/** Why `layout` cannot be read into an engine of `own`, or null when it can. */
export function layoutMismatch(layout: KvLayout, own: KvLayout): string | null {
  for (const k of ["numLayers", "numKvHeads", "headDim", "dtype", "rowBytes"] as const)
    if (layout[k] !== own[k]) return `${k} ${String(layout[k])} where this engine has ${String(own[k])}`;
  return null;
}

/** The typed error of a snapshot that cannot be decoded or does not fit. */
export class KvTransferError extends Error {
  override name = "KvTransferError";
}

/** How many leading tokens of `prompt` a snapshot covers: its common prefix with the prompt (K/V of a token depends only on the tokens up to it). */
export function usableTokens(snapshot: KvSnapshot, prompt: readonly number[]): number {
  const ids = snapshot.tokenIds;
  const n = Math.min(ids.length, prompt.length);
  let i = 0;
  while (i < n && ids[i] === prompt[i]) i++;
  return i;
}

const MAGIC = 0x4b4c4e4b; // "KNLK"

/** Wire form: magic u32, header length u32, the header as JSON (everything but data), then data. */
export function encodeSnapshot(s: KvSnapshot): Uint8Array {
  const header = Buffer.from(JSON.stringify({ layout: s.layout, tokenIds: s.tokenIds, model: s.model, lora: s.lora }), "utf8");
  const out = new Uint8Array(8 + header.length + s.data.length);
  const dv = new DataView(out.buffer);
  dv.setUint32(0, MAGIC, true);
  dv.setUint32(4, header.length, true);
  out.set(header, 8);
  out.set(s.data, 8 + header.length);
  return out;
}

/** Decodes encodeSnapshot's bytes; throws KvTransferError when they are not a whole snapshot. */
export function decodeSnapshot(bytes: Uint8Array): KvSnapshot {
  if (bytes.length < 8) throw new KvTransferError(`a KV snapshot of ${bytes.length} bytes is truncated`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dv.getUint32(0, true) !== MAGIC) throw new KvTransferError("not a KV snapshot (bad magic)");
  const len = dv.getUint32(4, true);
  if (8 + len > bytes.length) throw new KvTransferError("a KV snapshot's header is truncated");
  let h: unknown;
  try {
    h = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + 8, len).toString("utf8"));
  } catch {
    throw new KvTransferError("a KV snapshot's header is not JSON");
  }
  const o = h as Partial<KvSnapshot> | null;
  const l = o?.layout;
  const isCount = (x: unknown) => Number.isInteger(x) && (x as number) > 0;
  if (
    o === null || typeof o !== "object" || l === undefined || l === null || typeof l !== "object" ||
    !isCount(l.numLayers) || !isCount(l.numKvHeads) || !isCount(l.headDim) || !isCount(l.rowBytes) || typeof l.dtype !== "string" ||
    !Array.isArray(o.tokenIds) || !o.tokenIds.every((t) => Number.isInteger(t) && t >= 0) ||
    typeof o.model !== "string" || (o.lora !== null && typeof o.lora !== "string")
  )
    throw new KvTransferError("a KV snapshot's header lacks its layout, token ids, model or adapter");
  const layout: KvLayout = { numLayers: l.numLayers, numKvHeads: l.numKvHeads, headDim: l.headDim, dtype: l.dtype, rowBytes: l.rowBytes };
  const want = snapshotBytes(layout, o.tokenIds.length);
  if (bytes.length - 8 - len !== want)
    throw new KvTransferError(`a KV snapshot of ${o.tokenIds.length} tokens holds ${bytes.length - 8 - len} bytes of K/V, expected ${want}`);
  return { layout, tokenIds: o.tokenIds, model: o.model, lora: o.lora ?? null, data: bytes.subarray(8 + len) };
}
