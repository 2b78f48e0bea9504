// Checkpoints that store some projections fused (Phi-3: self_attn.qkv_proj = q, k and v stacked by rows,
// mlp.gate_up_proj = gate and up) read as the separate projections Kiln's layers hold: each part is a contiguous run
// of the fused matrix's rows, so a part's tensor info is the fused one's with its byte range narrowed (memory-mapped
// loads stay copy-free).
import type { SafetensorsHandle, SafetensorsTensorInfo } from "./formats/safetensors.js";
import { SAFETENSORS_DTYPE_SIZE } from "./formats/safetensors.js";
import type { ModelConfig } from "./hf-config.js";

/** One fused tensor's parts: each part's name suffix and its number of rows, in row order. */
interface Fusion {
  fused: string;
  parts: [string, number][];
}

/** Phi-3's fusions for one layer's module prefix (`model.layers.N.`). */
function phi3Fusions(c: ModelConfig): Fusion[] {
  const q = c.numAttentionHeads * c.headDim;
  const kv = c.numKeyValueHeads * c.headDim;
  return [
    { fused: "self_attn.qkv_proj.weight", parts: [["self_attn.q_proj.weight", q], ["self_attn.k_proj.weight", kv], ["self_attn.v_proj.weight", kv]] },
    { fused: "mlp.gate_up_proj.weight", parts: [["mlp.gate_proj.weight", c.intermediateSize], ["mlp.up_proj.weight", c.intermediateSize]] },
  ];
}

/**
 * The parts of a fused tensor `name` (`model.layers.N.self_attn.qkv_proj.weight`, ...): each part's full name and
 * row count, in row order; null for a tensor that is not one of the config's fusions.
 */
export function fusedParts(c: ModelConfig, name: string): [string, number][] | null {
  if (c.architecture !== "Phi3ForCausalLM") return null;
  const m = /^(model\.layers\.\d+\.)(.+)$/.exec(name);
  const f = m === null ? undefined : phi3Fusions(c).find((x) => x.fused === m[2]);
  return f === undefined ? null : f.parts.map(([suffix, rows]) => [`${m![1]}${suffix}`, rows]);
}

/** Whether the checkpoint stores Phi-3's fused projections. */
export function hasFusedProjections(h: SafetensorsHandle): boolean {
  return h.has("model.layers.0.self_attn.qkv_proj.weight");
}

/** The checkpoint with every fused tensor also readable as its parts (the parts' names only; the fused names remain). */
export function splitFusedProjections(h: SafetensorsHandle, c: ModelConfig, file: string): SafetensorsHandle {
  const parts = new Map<string, { fused: string; info: SafetensorsTensorInfo; rowStart: number; rows: number }>();
  for (let layer = 0; layer < c.numHiddenLayers; layer++) {
    for (const f of phi3Fusions(c)) {
      const fusedName = `model.layers.${layer}.${f.fused}`;
      const info = h.get(fusedName);
      if (info === undefined) continue;
      const total = f.parts.reduce((n, [, r]) => n + r, 0);
      if (info.shape.length !== 2 || info.shape[0] !== total)
        throw new Error(`${file}: ${fusedName} has shape [${info.shape.join(", ")}], expected [${total}, ...] for the config's sizes`);
      const rowBytes = info.shape[1]! * SAFETENSORS_DTYPE_SIZE[info.dtype];
      let row = 0;
      for (const [suffix, rows] of f.parts) {
        const name = `model.layers.${layer}.${suffix}`;
        parts.set(name, {
          fused: fusedName,
          info: { ...info, name, shape: [rows, info.shape[1]!], byteOffset: info.byteOffset + row * rowBytes, byteLength: rows * rowBytes },
          rowStart: row,
          rows,
        });
        row += rows;
      }
    }
  }
  const slice = <T extends Uint8Array | Float32Array>(all: T, p: { info: SafetensorsTensorInfo; rowStart: number; rows: number }, perRow: number): T =>
    all.slice(p.rowStart * perRow, (p.rowStart + p.rows) * perRow) as T;
  return {
    tensors: [...h.tensors, ...[...parts.values()].map((p) => p.info)],
    metadata: h.metadata,
    get: (name) => parts.get(name)?.info ?? h.get(name),
    has: (name) => parts.has(name) || h.has(name),
    load: (name) => {
      const p = parts.get(name);
      return p === undefined ? h.load(name) : slice(h.load(p.fused), p, p.info.byteLength / p.rows);
    },
    loadAsFloat32: (name) => {
      const p = parts.get(name);
      return p === undefined ? h.loadAsFloat32(name) : slice(h.loadAsFloat32(p.fused), p, p.info.shape[1]!);
    },
    close: () => h.close(),
  };
}
