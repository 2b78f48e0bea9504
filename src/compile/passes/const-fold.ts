// Constant folding: elementwise ops over scalar constants become constants, and identities
// (x + 0, x - 0, x * 1, x / 1, same-dtype cast of a const) forward their operand when that changes
// neither shape nor dtype. Runs before DCE, which removes what was bypassed.
import { mapOperands, type Graph, type Node, type NodeId } from "../ir.js";
import { evalBinary, evalUnary } from "../scalar-math.js";

function constValue(n: Node): number | undefined {
  return n.op.kind === "const" ? n.op.value : undefined;
}

function castValue(v: number, dtype: string): number {
  if (dtype === "bool") return v !== 0 ? 1 : 0;
  if (dtype === "float32" || dtype === "float16" || dtype === "bfloat16") return Math.fround(v);
  return Math.trunc(v);
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
    if (op.kind === "unary" && c(op.x) !== undefined) folded = evalUnary(op.fn, c(op.x)!);
    else if (op.kind === "cast" && c(op.x) !== undefined) folded = c(op.x)!;
    else if (op.kind === "binary" && c(op.a) !== undefined && c(op.b) !== undefined) folded = evalBinary(op.fn, c(op.a)!, c(op.b)!);
    else if (op.kind === "where" && c(op.cond) !== undefined && c(op.a) !== undefined && c(op.b) !== undefined) folded = c(op.cond)! ? c(op.a)! : c(op.b)!;
    if (folded !== undefined && n.shape.length === 0) {
      nodes.push({ ...n, op: { kind: "const", value: castValue(folded, n.dtype) } });
      continue;
    }
    if (op.kind === "binary") {
      const cb = c(op.b);
      const ca = c(op.a);
      const rightIdentity = (cb === 0 && (op.fn === "add" || op.fn === "sub")) || (cb === 1 && (op.fn === "mul" || op.fn === "div"));
      const leftIdentity = (ca === 0 && op.fn === "add") || (ca === 1 && op.fn === "mul");
      if (rightIdentity && sameAs(op.a)) forward.set(n.id, op.a);
      else if (leftIdentity && sameAs(op.b)) forward.set(n.id, op.b);
    }
    nodes.push(n);
  }
  return { ...g, nodes, outputs: g.outputs.map(f) };
}
