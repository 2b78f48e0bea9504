// Elementwise fusion: decides which nodes are computed inside which kernel. A node is inlined into its
// only user when that user is elementwise (same shape) or a row op taking it as the row input (a
// prologue); softmax/rms_norm are inlined into an elementwise user as an epilogue (e.g. rms_norm -> *
// scale, or silu(a) * b, or x + residual). Reductions, outputs and multi-use values are kernel roots.
// Reshape is an alias of its (materialized) input; permute is a strided read inlined into fused users.
import { ELEMENTWISE, operands, OPAQUE, users, type Graph, type NodeId } from "../ir.js";

export type Step =
  /** One generated loop nest computing `root`; `members` are the nodes computed inside it (root included). */
  | { kind: "fused"; root: NodeId; members: NodeId[] }
  /** A back-end kernel (matmul, rotary) or a custom op. */
  | { kind: "opaque"; node: NodeId };

export interface Schedule {
  steps: Step[];
  /** Where each node's value lives: itself (materialized), an alias base (reshape), or "inline". */
  home: ("self" | "inline" | { alias: NodeId })[];
}

export function fuse(g: Graph): Schedule {
  const u = users(g);
  const isOutput = new Set(g.outputs);
  const n = g.nodes.length;
  const inlineInto: (NodeId | null)[] = new Array(n).fill(null);
  const home: Schedule["home"] = new Array(n).fill("self");

  const sameShape = (a: NodeId, b: NodeId) => g.nodes[a]!.shape.join() === g.nodes[b]!.shape.join();
  const fusableUser = (id: NodeId, user: NodeId): boolean => {
    const uop = g.nodes[user]!.op;
    if (ELEMENTWISE.has(uop.kind)) return sameShape(id, user);
    if (uop.kind === "reduce" || uop.kind === "softmax" || uop.kind === "rms_norm") return uop.x === id;
    return false;
  };
  // Reverse topological order: a node joins its users' kernel when all of them are in one kernel and
  // each takes it as a fusable operand (multi-use values inside one kernel are recomputed per use site).
  const group: NodeId[] = new Array(n).fill(-1);
  for (let id = n - 1; id >= 0; id--) {
    const node = g.nodes[id]!;
    const kind = node.op.kind;
    const us = u[id]!;
    if (kind === "input" || kind === "param") continue;
    if (kind === "reshape") {
      home[id] = { alias: node.op.kind === "reshape" ? node.op.x : id };
      continue;
    }
    group[id] = id;
    if (isOutput.has(id)) continue;
    if (kind === "const") {
      if (us.every((x) => ELEMENTWISE.has(g.nodes[x]!.op.kind) || g.nodes[x]!.op.kind === "rms_norm")) home[id] = "inline";
      continue;
    }
    if (kind === "permute") {
      if (us.every((x) => ELEMENTWISE.has(g.nodes[x]!.op.kind) || g.nodes[x]!.op.kind === "reduce" || g.nodes[x]!.op.kind === "softmax" || g.nodes[x]!.op.kind === "rms_norm")) home[id] = "inline";
      continue;
    }
    if (us.length === 0) continue;
    const g0 = group[us[0]!]!;
    if (g0 < 0 || !us.every((x) => group[x] === g0)) continue;
    const ok = ELEMENTWISE.has(kind)
      ? us.every((x) => fusableUser(id, x))
      : (kind === "softmax" || kind === "rms_norm") && us.every((x) => ELEMENTWISE.has(g.nodes[x]!.op.kind) && sameShape(id, x));
    if (ok) {
      inlineInto[id] = us[0]!;
      group[id] = g0;
    }
  }
  for (let i = 0; i < n; i++) if (inlineInto[i] !== null) home[i] = "inline";
  // resolve reshape chains to their materialized base
  for (let i = 0; i < n; i++) {
    const h = home[i]!;
    if (typeof h === "object") {
      let base = h.alias;
      while (typeof home[base] === "object") base = (home[base] as { alias: NodeId }).alias;
      home[i] = { alias: base };
    }
  }
  // Every node that a non-fusing user (reshape, opaque, permute) reads must be materialized.
  for (const node of g.nodes) {
    const k = node.op.kind;
    if (k === "reshape" || k === "permute" || OPAQUE.has(k)) {
      for (const o of operands(node.op)) if (home[o] === "inline" && g.nodes[o]!.op.kind !== "const") home[o] = "self";
      if (OPAQUE.has(k)) for (const o of operands(node.op)) if (home[o] === "inline") home[o] = "self";
    }
  }
  // A kernel root's members: its inline operands, transitively (leaves stay outside).
  const steps: Step[] = [];
  for (const node of g.nodes) {
    const k = node.op.kind;
    if (home[node.id] !== "self" || k === "input" || k === "param") continue;
    if (OPAQUE.has(k)) {
      steps.push({ kind: "opaque", node: node.id });
      continue;
    }
    const members = new Set<NodeId>([node.id]);
    const visit = (id: NodeId) => {
      for (const o of operands(g.nodes[id]!.op)) {
        if (home[o] === "inline" && g.nodes[o]!.op.kind !== "const" && g.nodes[o]!.op.kind !== "permute" && !members.has(o)) {
          members.add(o);
          visit(o);
        }
      }
    };
    visit(node.id);
    steps.push({ kind: "fused", root: node.id, members: [...members].sort((a, b) => a - b) });
  }
  return { steps, home };
}
