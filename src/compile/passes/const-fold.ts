// Constant folding: elementwise ops over scalar constants become constants, and identities
// (x + 0 on integers, x + (-0), x - 0, x * 1, x / 1) forward their operand when that changes
// neither shape nor dtype. Runs before DCE, which removes what was bypassed.
import { bf16BitsToF32, f16BitsToF32, f32ToBf16Bits, f32ToF16Bits, isFloating, type DType } from "../../backends/dtype.js";
import { floatToInt } from "../../backends/int-math.js";
import { mapOperands, type Graph, type Node, type NodeId } from "../ir.js";
import { evalBinary, evalUnary } from "../scalar-math.js";

/** A const's value as its dtype holds it (a lifted 0.1 in float32 is fround(0.1)), as eager computes with it. */
function constValue(n: Node): number | undefined {
  return n.op.kind === "const" ? castValue(n.op.value, n.dtype) : undefined;
}

/** An integer or float result stored as `dtype`: integers wrap to its width, as the kernels' stores. */
function castValue(v: number, dtype: DType): number {
  if (dtype === "bool") return v !== 0 ? 1 : 0;
  if (dtype === "float32") return Math.fround(v);
  if (dtype === "bfloat16") return bf16BitsToF32(f32ToBf16Bits(v));
  if (dtype === "float16") return f16BitsToF32(f32ToF16Bits(v));
  if (dtype === "int32") return Int32Array.of(v)[0]!;
  if (dtype === "int8") return Int8Array.of(v)[0]!;
  if (dtype === "uint8") return Uint8Array.of(v)[0]!;
  return Number.isFinite(v) ? Number(BigInt.asIntN(64, BigInt(Math.trunc(v)))) : 0;
}

export function foldConstants(g: Graph): Graph {
  const nodes: Node[] = [];
  const forward = new Map<NodeId, NodeId>();
  const f = (id: NodeId) => forward.get(id) ?? id;
  for (const n0 of g.nodes) {
    const n: Node = { ...n0, op: mapOperands(n0.op, f) };
    const op = n.op;
    const c = (id: NodeId) => constValue(nodes[id]!);
    const sameAs = (id: NodeId) => nodes[id]!.dtype === n.dtype && nodes[id]!.shape.join() === n.shape.join();
    let folded: number | undefined;
    if (op.kind === "unary" && c(op.x) !== undefined) folded = evalUnary(op.fn, c(op.x)!, n.dtype);
    else if (op.kind === "cast" && c(op.x) !== undefined) {
      const from = nodes[op.x]!.dtype;
      folded = isFloating(from) && !isFloating(n.dtype) && n.dtype !== "bool" ? floatToInt(c(op.x)!, n.dtype) : c(op.x)!;
    } else if (op.kind === "binary" && c(op.a) !== undefined && c(op.b) !== undefined) folded = evalBinary(op.fn, c(op.a)!, c(op.b)!, n.dtype);
    else if (op.kind === "where" && c(op.cond) !== undefined && c(op.a) !== undefined && c(op.b) !== undefined) folded = c(op.cond)! ? c(op.a)! : c(op.b)!;
    if (folded !== undefined && n.shape.length === 0) {
      nodes.push({ ...n, op: { kind: "const", value: castValue(folded, n.dtype) } });
      continue;
    }
    if (op.kind === "binary") {
      const cb = c(op.b);
      const ca = c(op.a);
      // on floats only x + (-0) and x - (+0) are identities: -0 + 0 is +0 (eager gives +0)
      const float = isFloating(n.dtype);
      const addsZero = (v: number | undefined) => v === 0 && (!float || Object.is(v, -0));
      const subsZero = (v: number | undefined) => v === 0 && (!float || Object.is(v, 0));
      const rightIdentity = (addsZero(cb) && op.fn === "add") || (subsZero(cb) && op.fn === "sub") || (cb === 1 && (op.fn === "mul" || op.fn === "div"));
      const leftIdentity = (addsZero(ca) && op.fn === "add") || (ca === 1 && op.fn === "mul");
      if (rightIdentity && sameAs(op.a)) forward.set(n.id, op.a);
      else if (leftIdentity && sameAs(op.b)) forward.set(n.id, op.b);
    }
    nodes.push(n);
  }
  return { ...g, nodes, outputs: g.outputs.map(f) };
}
