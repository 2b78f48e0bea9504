// Op-by-op execution of the IR through the eager tensor ops: the slow, readable reference of every
// compiled program (STYLE.md 9) and the fallback when no C compiler or JIT addon is available.
import type { BufferView, KernelCall } from "../backends/backend.js";
import { runKernel } from "../tensor/dispatch.js";
import { broadcastView } from "../tensor/ops/shape.js";
import * as k from "../tensor/index.js";
import { Tensor, type Device } from "../tensor/index.js";
import { Storage } from "../tensor/storage.js";
import type { OpaqueFn } from "./capture.js";
import type { Graph, Node, NodeId } from "./ir.js";
import { customOp } from "./custom-op-registry.js";
import { quantizedLinear, type QuantizedWeight } from "../tensor/ops/linalg.js";

/** A tensor over memory someone else owns (a program's arena or bound buffer): disposing it never frees that. */
export function aliasOf(device: Device, v: BufferView): Tensor {
  const storage = new Storage(device, v.buffer);
  storage.retain(); // the owner's reference: release by the alias never reaches zero
  return new Tensor(storage, v.dtype, v.shape, v.strides, v.offset);
}

/**
 * An elementwise node run as eager runs its kernel, into the node's dtype: operands broadcast to the node's shape, each
 * read in its own dtype, the result rounded once. The node's dtype is the truth, not what eager's op wrapper would
 * infer from the operands here: dispatch capture sees a 0-d scalar operand as a broadcast [1] buffer (bf16[n] * f32[]
 * is bf16, bf16[n] * f32[1] would promote to float32).
 */
function elementwise(n: Node, operands: Tensor[], call: (views: BufferView[], out: BufferView) => KernelCall): Tensor {
  const device = operands[0]!.device;
  const out = k.empty(n.shape, { dtype: n.dtype, device });
  const views = operands.map((t) => broadcastView(t, n.shape, n.op.kind));
  const c = call(views.map((x) => x.view_(n.op.kind)), out.view_(n.op.kind));
  runKernel(c.op, device, c, n.op.kind === "where" ? [] : [out]);
  for (const x of views) x.dispose();
  return out;
}

export interface InterpretOptions {
  /** Bodies of `call` nodes. */
  calls?: readonly OpaqueFn[];
  /** Real size of the bucketed dim (paged attention runs on that many tokens); null: the full shape. */
  dynSize?: number | null;
}

export function interpret(g: Graph, inputs: Tensor[], params: Tensor[], options: InterpretOptions = {}): Tensor[] {
  const vals: Tensor[] = [];
  const owned = new Set<NodeId>();
  const dev = (inputs[0] ?? params[0])?.device;
  for (const n of g.nodes) {
    const op = n.op;
    const v = (id: NodeId) => vals[id]!;
    let out: Tensor;
    switch (op.kind) {
      case "input":
        out = inputs[op.index]!;
        break;
      case "param":
        out = params[op.index]!;
        break;
      case "const":
        out = k.full(n.shape, op.value, { dtype: n.dtype, device: dev });
        break;
      case "unary":
        out = elementwise(n, [v(op.x)], ([x], o) => ({ op: "unary", fn: op.fn, x: x!, out: o }));
        break;
      case "binary":
        out = elementwise(n, [v(op.a), v(op.b)], ([a, b], o) => ({ op: "binary", fn: op.fn, a: a!, b: b!, out: o }));
        break;
      case "where":
        out = elementwise(n, [v(op.cond), v(op.a), v(op.b)], ([c, a, b], o) => ({ op: "where", cond: c!, a: a!, b: b!, out: o }));
        break;
      case "cast":
        out = v(op.x).dtype === n.dtype ? v(op.x).clone() : v(op.x).to(n.dtype);
        break;
      case "reduce":
        out = op.fn === "sum" ? k.sum(v(op.x), -1, op.keepdim) : op.fn === "mean" ? k.mean(v(op.x), -1, op.keepdim) : op.fn === "max" ? k.max(v(op.x), -1, op.keepdim) : k.min(v(op.x), -1, op.keepdim);
        break;
      case "softmax":
        out = op.log ? k.logSoftmax(v(op.x), -1) : k.softmax(v(op.x), -1);
        break;
      case "rms_norm":
        out = k.rmsNorm(v(op.x), v(op.weight), op.eps);
        break;
      case "matmul":
        out = op.bTransposed ? k.linear(v(op.a), v(op.b)) : k.matmul(v(op.a), v(op.b));
        break;
      case "rotary":
        out = k.rotaryEmbedding(v(op.x), v(op.positions), v(op.cos), v(op.sin), op.neox);
        break;
      case "custom":
        out = customOp(op.name).eager(op.inputs.map(v));
        break;
      case "gather_rows":
        out = k.embedding(v(op.ids), v(op.table));
        break;
      case "quant_matmul": {
        const [N, K] = [n.shape[1]!, v(op.x).shape[1]!];
        const weight: QuantizedWeight = { scheme: op.scheme, outFeatures: N, inFeatures: K, data: v(op.w), scales: v(op.scales), rowSums: op.rowSums === null ? null : v(op.rowSums) };
        out = quantizedLinear(v(op.x), weight);
        break;
      }
      case "paged_attention": {
        const T = n.shape[0]!;
        const rows = op.dynamicTokens && options.dynSize != null ? options.dynSize : T;
        const head = (t: Tensor) => (rows === T ? t : t.narrow(0, 0, rows));
        const [q, kk, vv, slots] = [v(op.q), v(op.k), v(op.v), v(op.slotMapping)].map(head) as [Tensor, Tensor, Tensor, Tensor];
        const pos = op.rotary ? head(v(op.rotary.positions)) : null;
        const r = k.pagedAttention({
          q, k: kk, v: vv, kCache: v(op.kCache), vCache: v(op.vCache), slotMapping: slots, blockTables: v(op.blockTables),
          queryStart: v(op.queryStart), seqLens: v(op.seqLens), scale: op.scale, slidingWindow: op.slidingWindow, softcap: op.softcap,
          rotary: op.rotary && pos ? { positions: pos, cos: v(op.rotary.cos), sin: v(op.rotary.sin), neox: op.rotary.neox } : null,
          sinks: op.sinks === null ? null : v(op.sinks), bidirectional: op.bidirectional,
        });
        if (pos && pos !== v(op.rotary!.positions)) pos.dispose();
        if (rows === T) out = r;
        else {
          out = k.zeros(n.shape, { device: dev });
          const region = out.narrow(0, 0, rows);
          region.copy_(r);
          for (const t of [region, r, q, kk, vv, slots]) t.dispose();
        }
        break;
      }
      case "call": {
        const body = options.calls?.[op.index];
        if (!body) throw new Error(`opaque call #${op.index} has no body`);
        out = body(op.inputs.map(v));
        break;
      }
      case "reshape":
        out = k.reshape(v(op.x), [...n.shape]);
        break;
      case "permute":
        out = k.permute(v(op.x), op.dims);
        break;
    }
    vals.push(out);
    if (op.kind !== "input" && op.kind !== "param") owned.add(n.id);
  }
  const results = g.outputs.map((o) => (owned.has(o) ? vals[o]!.contiguous() : vals[o]!.clone()));
  for (const id of owned) if (!results.includes(vals[id]!)) vals[id]!.dispose();
  return results;
}
