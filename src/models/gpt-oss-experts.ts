// gpt-oss checkpoints store each layer's experts fused, as transformers' GptOssExperts holds them:
//   mlp.experts.gate_up_proj [E, hidden, 2 * inter] (x @ W; gate and up interleaved: even columns gate, odd up),
//   mlp.experts.gate_up_proj_bias [E, 2 * inter], mlp.experts.down_proj [E, inter, hidden], down_proj_bias [E, hidden];
// or, in OpenAI's released checkpoints (quant_method "mxfp4"), the two matrices as MXFP4 rows of [out, in]:
//   gate_up_proj_blocks [E, 2 * inter, hidden / 32, 16] + gate_up_proj_scales [E, 2 * inter, hidden / 32] (gate rows
//   even, up rows odd), down_proj_blocks [E, hidden, inter / 32, 16] + down_proj_scales, the biases as above.
// Kiln's MoE holds per-expert Linear layers (experts.{e}.gate_proj / up_proj / down_proj, [out, in] weights and
// biases); this reads each expert's slice of the fused tensors straight from the file (one expert in memory at a
// time) and hands out its six parameters. MXFP4 rows go to the mxfp4 kernel bit for bit (never dequantized) where
// the native addon has it and in_features % 64 == 0; otherwise they are dequantized to the model dtype, with a note.
import * as fs from "node:fs";
import type { DType } from "../backends/dtype.js";
import { tryLoadNativeKernels } from "../backends/cpu/native.js";
import { nativeTakesScheme, quantizeWeightsRef } from "../backends/cpu/quant-reference.js";
import { resolveDevice } from "../tensor/device.js";
import { fromBytes, tensor, type DeviceLike, type Tensor } from "../tensor/index.js";
import { installQuantizedWeight } from "../nn/quantized-linear.js";
import { Linear } from "../nn/layers.js";
import type { Module } from "../nn/module.js";
import { fitsGroupKernels } from "./formats/gguf-repack.js";
import { bf16BitsToF32, f32ToBf16 } from "./formats/dtype-convert.js";
import { dequantizeOpenaiMxfp4Rows, kilnToOpenaiMxfp4, openaiMxfp4RowsToGgml, openaiMxfp4RowsToKiln } from "./formats/openai-mxfp4.js";
import type { GgufWriteTensor } from "./formats/gguf.js";
import type { GgmlTypeName } from "./formats/gguf-quant.js";
import {
  SAFETENSORS_DTYPE_SIZE, toFloat32, type SafetensorsHandle, type SafetensorsLazyTensor, type SafetensorsTensorInfo,
} from "./formats/safetensors.js";
import type { ModelConfig } from "./hf-config.js";
import { ModelLoadError, paramDtype } from "./loader.js";

type Json = Record<string, unknown>;

/** Whether config.json declares OpenAI's MXFP4 experts (quantization_config.quant_method "mxfp4"). */
export function isMxfp4Checkpoint(config: Json): boolean {
  const qc = config.quantization_config;
  return qc !== null && typeof qc === "object" && (qc as Json).quant_method === "mxfp4";
}

const EXPERT_PARAM = /^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|bias)$/;

/** One expert's parameters: float values [out, in] / [out], or an MXFP4 weight in Kiln's layout. */
type ExpertPart = { values: Float32Array; shape: number[] } | { mxfp4: { data: Uint8Array; scales: Uint8Array }; shape: [number, number] };

/**
 * Loads the fused expert tensors of a gpt-oss checkpoint into `model`'s per-expert Linear layers. has(name): the
 * checkpoint holds that expert parameter (fused); take(name) installs it (false: not an expert parameter).
 */
export function gptOssExpertLoader(handle: SafetensorsHandle, model: Module, config: ModelConfig, dtype: DType, device: DeviceLike | undefined, note: (m: string) => void) {
  const moe = config.moe!;
  const [hidden, inter, E] = [config.hiddenSize, moe.moeIntermediateSize, moe.numExperts];
  const dev = resolveDevice(device);
  const native = dev.backend.name === "cpu" ? tryLoadNativeKernels() : null;
  const mxfp4Kernel = native !== null && nativeTakesScheme(native, "mxfp4");
  const linears = new Map<string, Linear>();
  for (const [name, m] of model.namedModules()) if (m instanceof Linear) linears.set(name, m);
  const dequantized = new Set<string>();
  let quantized = 0;
  let fd: { file: string; fd: number } | null = null;

  /** Bytes of expert e's slice of a fused tensor [E, ...] (read from the file, not the whole tensor). */
  const slice = (info: SafetensorsTensorInfo, e: number): Uint8Array => {
    if (info.shape[0] !== E) throw new ModelLoadError(`${info.name} is [${info.shape.join(", ")}]: expected ${E} experts first`);
    const per = info.byteLength / E;
    if (fd?.file !== info.file) {
      if (fd !== null) fs.closeSync(fd.fd);
      fd = { file: info.file, fd: fs.openSync(info.file, "r") };
    }
    const out = new Uint8Array(per);
    fs.readSync(fd.fd, out, 0, per, info.byteOffset + e * per);
    return out;
  };
  const info = (name: string, shape: number[]): SafetensorsTensorInfo => {
    const i = handle.get(name);
    if (i === undefined) throw new ModelLoadError(`checkpoint lacks ${name}`);
    if (i.shape.join() !== shape.join()) throw new ModelLoadError(`${name} is [${i.shape.join(", ")}], the config says [${shape.join(", ")}]`);
    return i;
  };
  const floats = (i: SafetensorsTensorInfo, e: number): Float32Array => toFloat32(slice(i, e), i.dtype);
  const even = (n: number) => Array.from({ length: n }, (_, i) => 2 * i);
  const odd = (n: number) => Array.from({ length: n }, (_, i) => 2 * i + 1);
  const all = (n: number) => Array.from({ length: n }, (_, i) => i);

  /** The MXFP4 rows of expert e of `<prefix>.<proj>_blocks` / `_scales` ([rows, k]), in Kiln's layout or as floats. */
  const mxfp4Rows = (prefix: string, proj: string, e: number, rows: number, k: number, pick: number[]): ExpertPart => {
    const b = info(`${prefix}.${proj}_blocks`, [E, rows, k / 32, 16]);
    const s = info(`${prefix}.${proj}_scales`, [E, rows, k / 32]);
    for (const x of [b, s]) if (SAFETENSORS_DTYPE_SIZE[x.dtype] !== 1) throw new ModelLoadError(`${x.name} is ${x.dtype}, expected U8`);
    const [blocks, scales] = [slice(b, e), slice(s, e)];
    if (mxfp4Kernel && fitsGroupKernels(k)) return { mxfp4: openaiMxfp4RowsToKiln(blocks, scales, pick, k), shape: [pick.length, k] };
    dequantized.add(`${prefix}.${proj}`);
    return { values: dequantizeOpenaiMxfp4Rows(blocks, scales, pick, k), shape: [pick.length, k] };
  };

  /** Expert e's six parameters under their Kiln names (suffixes "gate_proj.weight", ...). */
  const readExpert = (prefix: string, e: number): Map<string, ExpertPart> => {
    const parts = new Map<string, ExpertPart>();
    if (handle.has(`${prefix}.gate_up_proj_blocks`)) {
      parts.set("gate_proj.weight", mxfp4Rows(prefix, "gate_up_proj", e, 2 * inter, hidden, even(inter)));
      parts.set("up_proj.weight", mxfp4Rows(prefix, "gate_up_proj", e, 2 * inter, hidden, odd(inter)));
      parts.set("down_proj.weight", mxfp4Rows(prefix, "down_proj", e, hidden, inter, all(hidden)));
    } else {
      // x @ W with W [hidden, 2 * inter]: Linear's [out, in] is its transpose, gate the even columns, up the odd
      const gu = floats(info(`${prefix}.gate_up_proj`, [E, hidden, 2 * inter]), e);
      const gate = new Float32Array(inter * hidden);
      const up = new Float32Array(inter * hidden);
      for (let h = 0; h < hidden; h++)
        for (let i = 0; i < inter; i++) {
          gate[i * hidden + h] = gu[h * 2 * inter + 2 * i]!;
          up[i * hidden + h] = gu[h * 2 * inter + 2 * i + 1]!;
        }
      const d = floats(info(`${prefix}.down_proj`, [E, inter, hidden]), e);
      const down = new Float32Array(hidden * inter);
      for (let i = 0; i < inter; i++) for (let h = 0; h < hidden; h++) down[h * inter + i] = d[i * hidden + h]!;
      parts.set("gate_proj.weight", { values: gate, shape: [inter, hidden] });
      parts.set("up_proj.weight", { values: up, shape: [inter, hidden] });
      parts.set("down_proj.weight", { values: down, shape: [hidden, inter] });
    }
    const gub = floats(info(`${prefix}.gate_up_proj_bias`, [E, 2 * inter]), e);
    parts.set("gate_proj.bias", { values: Float32Array.from(even(inter), (j) => gub[j]!), shape: [inter] });
    parts.set("up_proj.bias", { values: Float32Array.from(odd(inter), (j) => gub[j]!), shape: [inter] });
    parts.set("down_proj.bias", { values: floats(info(`${prefix}.down_proj_bias`, [E, hidden]), e), shape: [hidden] });
    return parts;
  };

  // the expert being handed out (parameters are taken in order: one expert's six, then the next's)
  let current: { key: string; parts: Map<string, ExpertPart> } | null = null;

  return {
    has(name: string): boolean {
      const m = EXPERT_PARAM.exec(name);
      if (m === null) return false;
      const fused = m[4] === "bias" ? `${m[3] === "down_proj" ? "down_proj" : "gate_up_proj"}_bias` : m[3] === "down_proj" ? "down_proj" : "gate_up_proj";
      return handle.has(`${m[1]}.${fused}`) || (m[4] === "weight" && handle.has(`${m[1]}.${fused}_blocks`));
    },
    take(name: string): boolean {
      const m = EXPERT_PARAM.exec(name);
      if (m === null || !this.has(name)) return false;
      const [prefix, e, suffix] = [m[1]!, Number(m[2]), `${m[3]}.${m[4]}`];
      const key = `${prefix}.${e}`;
      if (current?.key !== key) current = { key, parts: readExpert(prefix, e) };
      const part = current.parts.get(suffix)!;
      current.parts.delete(suffix);
      const moduleName = `${key}.${m[3]}`;
      if ("mxfp4" in part) {
        const [n, k] = part.shape;
        const q = part.mxfp4;
        const data = fromBytes(q.data, "uint8", [n, k / 2], { device: dev });
        const scales = fromBytes(q.scales, "uint8", [n, k / 32], { device: dev });
        installQuantizedWeight(model, moduleName, linears.get(moduleName)!, { scheme: "mxfp4", outFeatures: n, inFeatures: k, data, scales, rowSums: null });
        quantized++;
        return true;
      }
      const f = tensor(part.values, { shape: part.shape, device: dev });
      const want = paramDtype(name, dtype);
      model.setParameter(name, want === "float32" ? f : castAndFree(f, want));
      return true;
    },
    finish(where: string): void {
      if (fd !== null) fs.closeSync(fd.fd);
      fd = null;
      if (dequantized.size > 0) {
        const why = mxfp4Kernel ? "in_features % 64 != 0 (the mxfp4 kernel takes 64-element chunks)" : "this native addon lacks the mxfp4 kernel";
        note(`[load] ${where}: MXFP4 experts dequantized to ${dtype} (${why}): ${[...dequantized].slice(0, 3).join(", ")}${dequantized.size > 3 ? ", ..." : ""}`);
      }
    },
    /** "mxfp4" once any expert runs the mxfp4 kernel. */
    scheme: (): "mxfp4" | null => (quantized > 0 ? "mxfp4" : null),
  };
}

function castAndFree(f: Tensor, dtype: DType): Tensor {
  const c = f.to(dtype);
  f.dispose();
  return c;
}

/**
 * Replaces the per-expert tensors (Kiln's names) of a model being written with gpt-oss's fused ones, in place: the
 * HF float layout (dtype as the parts), or with `mxfp4` the expert matrices as OpenAI's MXFP4 blocks and scales
 * (rounded as `--quantization mxfp4` rounds), biases float32. The inverse of gptOssExpertLoader, for init-model.
 */
export function fuseGptOssExperts(tensors: SafetensorsLazyTensor[], config: ModelConfig, mxfp4: boolean): void {
  const moe = config.moe!;
  const [H, I, E] = [config.hiddenSize, moe.moeIntermediateSize, moe.numExperts];
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const fused: SafetensorsLazyTensor[] = [];
  const gone = new Set<string>();
  const prefixes = [...new Set(tensors.flatMap((t) => EXPERT_PARAM.exec(t.name)?.[1] ?? []))];
  /** Expert e's `suffix` values as float32 (bf16 parts widened). */
  const part = (prefix: string, e: number, suffix: string): Float32Array => {
    const t = byName.get(`${prefix}.${e}.${suffix}`)!;
    gone.add(t.name);
    const d = t.data();
    return d instanceof Float32Array ? d : d instanceof Uint16Array ? Float32Array.from(d, bf16BitsToF32) : toFloat32(new Uint8Array(d.buffer, d.byteOffset, d.byteLength), t.dtype);
  };
  for (const prefix of prefixes) {
    const weightDtype = byName.get(`${prefix}.0.gate_proj.weight`)!.dtype;
    for (let e = 0; e < E; e++) for (const p of ["gate_proj", "up_proj", "down_proj"]) for (const s of ["weight", "bias"]) gone.add(`${prefix}.${e}.${p}.${s}`);
    const perExpert = (n: number, fill: (e: number, out: Float32Array) => void): Float32Array => {
      const out = new Float32Array(E * n);
      for (let e = 0; e < E; e++) fill(e, out.subarray(e * n, (e + 1) * n));
      return out;
    };
    const asDtype = (v: Float32Array): ArrayBufferView => (weightDtype === "BF16" ? f32ToBf16(v) : v);
    const biases: SafetensorsLazyTensor[] = [
      {
        name: `${prefix}.gate_up_proj_bias`, dtype: "F32", shape: [E, 2 * I],
        data: () => perExpert(2 * I, (e, o) => {
          const [g, u] = [part(prefix, e, "gate_proj.bias"), part(prefix, e, "up_proj.bias")];
          for (let i = 0; i < I; i++) [o[2 * i], o[2 * i + 1]] = [g[i]!, u[i]!];
        }),
      },
      { name: `${prefix}.down_proj_bias`, dtype: "F32", shape: [E, H], data: () => perExpert(H, (e, o) => o.set(part(prefix, e, "down_proj.bias"))) },
    ];
    if (!mxfp4) {
      fused.push(
        {
          name: `${prefix}.gate_up_proj`, dtype: weightDtype, shape: [E, H, 2 * I],
          data: () => asDtype(perExpert(H * 2 * I, (e, o) => {
            const [g, u] = [part(prefix, e, "gate_proj.weight"), part(prefix, e, "up_proj.weight")]; // [I, H] each
            for (let i = 0; i < I; i++) for (let h = 0; h < H; h++) [o[h * 2 * I + 2 * i], o[h * 2 * I + 2 * i + 1]] = [g[i * H + h]!, u[i * H + h]!];
          })),
        },
        {
          name: `${prefix}.down_proj`, dtype: weightDtype, shape: [E, I, H],
          data: () => asDtype(perExpert(I * H, (e, o) => {
            const d = part(prefix, e, "down_proj.weight"); // [H, I]
            for (let h = 0; h < H; h++) for (let i = 0; i < I; i++) o[i * H + h] = d[h * I + i]!;
          })),
        },
        ...biases,
      );
      continue;
    }
    // MXFP4: rows of [out, in] (gate_up: gate rows even, up rows odd), blocks and scales per expert in turn
    const quantized = (e: number, suffix: string, n: number, k: number) =>
      kilnToOpenaiMxfp4(quantizeWeightsRef("mxfp4", part(prefix, e, suffix), n, k) as { data: Uint8Array; scales: Uint8Array }, n, k);
    const gateUp = (e: number) => {
      const [g, u] = [quantized(e, "gate_proj.weight", I, H), quantized(e, "up_proj.weight", I, H)];
      const blocks = new Uint8Array(I * H);
      const scales = new Uint8Array((2 * I * H) / 32);
      for (let i = 0; i < I; i++)
        for (const [j, q] of [[0, g], [1, u]] as const) {
          blocks.set(q.blocks.subarray((i * H) / 2, ((i + 1) * H) / 2), ((2 * i + j) * H) / 2);
          scales.set(q.scales.subarray((i * H) / 32, ((i + 1) * H) / 32), ((2 * i + j) * H) / 32);
        }
      return { blocks, scales };
    };
    // each expert's blocks and scales come from one rounding: the blocks tensor (written first) keeps it for the scales
    const pending = new Map<string, { blocks: Uint8Array; scales: Uint8Array }>();
    const once = (key: string, make: () => { blocks: Uint8Array; scales: Uint8Array }, take: "blocks" | "scales") => {
      const q = pending.get(key) ?? make();
      if (take === "blocks") pending.set(key, q);
      else pending.delete(key);
      return q[take];
    };
    const stacked = (name: string, shape: number[], one: (e: number) => Uint8Array): SafetensorsLazyTensor => ({
      name, dtype: "U8", shape,
      data: () => {
        const parts = Array.from({ length: E }, (_, e) => one(e));
        const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
        parts.reduce((at, p) => (out.set(p, at), at + p.length), 0);
        return out;
      },
    });
    fused.push(
      stacked(`${prefix}.gate_up_proj_blocks`, [E, 2 * I, H / 32, 16], (e) => once(`gu${e}`, () => gateUp(e), "blocks")),
      stacked(`${prefix}.gate_up_proj_scales`, [E, 2 * I, H / 32], (e) => once(`gu${e}`, () => gateUp(e), "scales")),
      stacked(`${prefix}.down_proj_blocks`, [E, H, I / 32, 16], (e) => once(`d${e}`, () => quantized(e, "down_proj.weight", H, I), "blocks")),
      stacked(`${prefix}.down_proj_scales`, [E, H, I / 32], (e) => once(`d${e}`, () => quantized(e, "down_proj.weight", H, I), "scales")),
      ...biases,
    );
  }
  const kept = tensors.filter((t) => !gone.has(t.name));
  tensors.splice(0, tensors.length, ...kept, ...fused);
}

/** A fused gpt-oss expert tensor of a checkpoint (gate_up_proj / down_proj, their biases, or their MXFP4 blocks and scales). */
const FUSED_EXPERTS = /^(model\.layers\.(\d+)\.mlp\.experts)\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$/;

export function isGptOssFusedExpertTensor(name: string): boolean {
  return FUSED_EXPERTS.test(name);
}

/**
 * A gpt-oss checkpoint's fused experts as llama.cpp's gpt-oss GGUF holds them, per layer N: blk.N.ffn_{gate,up}_exps
 * [E, inter, hidden] (gate_up_proj's even / odd outputs), ffn_down_exps [E, hidden, inter], and their biases [E, out].
 * MXFP4 experts stay MXFP4 (the file's codes and scales moved into ggml's blocks, never re-rounded); float experts
 * take `typeFor`'s type. Tensors are read when written (one at a time).
 */
export function gptOssGgufExpertTensors(handle: SafetensorsHandle, config: ModelConfig, typeFor: (shape: readonly number[]) => GgmlTypeName): GgufWriteTensor[] {
  const moe = config.moe!;
  const [H, I, E] = [config.hiddenSize, moe.moeIntermediateSize, moe.numExperts];
  const prefixes = new Map<number, string>();
  for (const t of handle.tensors) {
    const m = FUSED_EXPERTS.exec(t.name);
    if (m) prefixes.set(Number(m[2]), m[1]!);
  }
  const info = (name: string, shape: number[]): string => {
    const i = handle.get(name);
    if (i === undefined) throw new ModelLoadError(`[convert] checkpoint lacks ${name}`);
    if (i.shape.join() !== shape.join()) throw new ModelLoadError(`[convert] ${name} is [${i.shape.join(", ")}], the config says [${shape.join(", ")}]`);
    return name;
  };
  const range = (n: number, f: (i: number) => number) => Array.from({ length: n }, (_, i) => f(i));
  const out: GgufWriteTensor[] = [];
  for (const [layer, prefix] of [...prefixes].sort((a, b) => a[0] - b[0])) {
    const blk = `blk.${layer}`;
    if (handle.has(`${prefix}.gate_up_proj_blocks`)) {
      const mxfp4 = (proj: string, rows: number, k: number, pick: number[]) => () => {
        const [b, s] = [info(`${prefix}.${proj}_blocks`, [E, rows, k / 32, 16]), info(`${prefix}.${proj}_scales`, [E, rows, k / 32])];
        return openaiMxfp4RowsToGgml(handle.load(b), handle.load(s), pick, k);
      };
      // expert e's gate rows are e * 2I + 2i of gate_up_proj, its up rows e * 2I + 2i + 1
      const gateRows = range(E * I, (j) => Math.floor(j / I) * 2 * I + 2 * (j % I));
      out.push(
        { name: `${blk}.ffn_gate_exps.weight`, shape: [E, I, H], type: "MXFP4", loadRaw: mxfp4("gate_up_proj", 2 * I, H, gateRows) },
        { name: `${blk}.ffn_up_exps.weight`, shape: [E, I, H], type: "MXFP4", loadRaw: mxfp4("gate_up_proj", 2 * I, H, gateRows.map((r) => r + 1)) },
        { name: `${blk}.ffn_down_exps.weight`, shape: [E, H, I], type: "MXFP4", loadRaw: mxfp4("down_proj", H, I, range(E * H, (j) => j)) },
      );
    } else {
      // x @ W with W [E, hidden, 2 * inter]: GGUF's [E, out, in] is its transpose, gate the even columns, up the odd
      const gateUp = (parity: number) => () => {
        const gu = handle.loadAsFloat32(info(`${prefix}.gate_up_proj`, [E, H, 2 * I]));
        const w = new Float32Array(E * I * H);
        for (let e = 0; e < E; e++) for (let i = 0; i < I; i++) for (let h = 0; h < H; h++) w[(e * I + i) * H + h] = gu[(e * H + h) * 2 * I + 2 * i + parity]!;
        return w;
      };
      const down = () => {
        const d = handle.loadAsFloat32(info(`${prefix}.down_proj`, [E, I, H]));
        const w = new Float32Array(E * H * I);
        for (let e = 0; e < E; e++) for (let i = 0; i < I; i++) for (let h = 0; h < H; h++) w[(e * H + h) * I + i] = d[(e * I + i) * H + h]!;
        return w;
      };
      out.push(
        { name: `${blk}.ffn_gate_exps.weight`, shape: [E, I, H], type: typeFor([I, H]), load: gateUp(0) },
        { name: `${blk}.ffn_up_exps.weight`, shape: [E, I, H], type: typeFor([I, H]), load: gateUp(1) },
        { name: `${blk}.ffn_down_exps.weight`, shape: [E, H, I], type: typeFor([H, I]), load: down },
      );
    }
    const guBias = (parity: number) => () => {
      const b = handle.loadAsFloat32(info(`${prefix}.gate_up_proj_bias`, [E, 2 * I]));
      return Float32Array.from({ length: E * I }, (_, j) => b[2 * j + parity]!); // (e, i) -> e * 2I + 2i + parity
    };
    out.push(
      { name: `${blk}.ffn_gate_exps.bias`, shape: [E, I], type: "F32", load: guBias(0) },
      { name: `${blk}.ffn_up_exps.bias`, shape: [E, I], type: "F32", load: guBias(1) },
      { name: `${blk}.ffn_down_exps.bias`, shape: [E, H], type: "F32", load: () => handle.loadAsFloat32(info(`${prefix}.down_proj_bias`, [E, H])) },
    );
  }
  return out;
}
