// torch.einsum over any number of operands, built from diagonal, sum, permute, reshape and matmul: each operand's
// repeated labels become diagonals and its private labels are summed, then the operands are contracted left to
// right, each pair as one batched matmul ([batch, left, contracted] @ [batch, contracted, right]).
import { OpError } from "../../util/errors.js";
import { numel, Tensor } from "../tensor.js";
import { matmul } from "./linalg.js";
import { diagonal } from "./matrix.js";
import { sum } from "./reduce.js";

const op = "einsum";

/** A tensor with one label per dim: a letter, or "." plus the position of an ellipsis dim (right-aligned). */
interface Labelled {
  t: Tensor;
  labels: string[];
}

/** The labels of one subscript term: letters and at most one "..." spanning `ndim - letters` dims. */
function parseTerm(term: string, ndim: number | null, ellipsisRank: number, where: string): string[] {
  const parts = term.split("...");
  if (parts.length > 2) throw new OpError(op, `${where} has more than one ellipsis ("...")`);
  for (const ch of parts.join(""))
    if (!/[a-zA-Z]/.test(ch)) throw new OpError(op, `invalid subscript "${ch}" in ${where}: subscripts must be letters in [a-zA-Z] or "..."`);
  const letters = parts.join("").length;
  if (ndim !== null && (parts.length === 1 ? letters !== ndim : letters > ndim))
    throw new OpError(op, `${where} has ${letters} subscripts${parts.length === 2 ? " and an ellipsis" : ""} for a ${ndim}-d operand`);
  if (parts.length === 1) return [...term];
  const covered = ndim === null ? ellipsisRank : ndim - letters;
  const dots = Array.from({ length: covered }, (_, j) => `.${ellipsisRank - covered + j}`);
  return [...parts[0]!, ...dots, ...parts[1]!];
}

/**
 * torch.einsum: "ij,jk->ik" style equations, explicit ("->") or implicit output (the labels appearing once, in
 * alphabetical order, after the ellipsis dims); "..." broadcasts; a label repeated within one operand takes its
 * diagonal ("ii->i"); labels absent from the output are summed. Operands may also come as one array.
 * @example einsum("bij,bjk->bik", a, b) // bmm(a, b)
 */
export function einsum(equation: string, ...args: Tensor[] | [Tensor[]]): Tensor {
  const operands = args.length === 1 && Array.isArray(args[0]) ? args[0] : (args as Tensor[]);
  const eq = equation.replace(/\s+/g, "");
  const arrow = eq.split("->");
  if (arrow.length > 2) throw new OpError(op, `equation "${equation}" has more than one "->"`);
  const terms = arrow[0]!.split(",");
  if (terms.length !== operands.length)
    throw new OpError(op, `the equation has ${terms.length} operand terms but ${operands.length} operands were given`);
  const ellipsisRank = Math.max(0, ...terms.map((term, i) => (term.includes("...") ? operands[i]!.ndim - (term.length - 3) : 0)));
  const inputs = terms.map((term, i) => ({ t: operands[i]!, labels: parseTerm(term, operands[i]!.ndim, ellipsisRank, `operand ${i} ("${term}")`) }));
  const sizes = labelSizes(inputs);
  const output = outputLabels(arrow.length === 2 ? arrow[1]! : null, inputs, ellipsisRank);

  const owned = new Set<Tensor>();
  const own = (t: Tensor): Tensor => (owned.add(t), t);
  try {
    const prepared = inputs.map((x, i) => {
      const later = new Set([...output, ...inputs.filter((_, j) => j !== i).flatMap((o) => o.labels)]);
      return sumOut(takeDiagonals(x, own), (l) => !later.has(l), own);
    });
    let acc = prepared[0]!;
    for (let i = 1; i < prepared.length; i++) {
      const keep = new Set([...output, ...prepared.slice(i + 1).flatMap((o) => o.labels)]);
      acc = contract(acc, prepared[i]!, keep, sizes, own);
    }
    acc = sumOut(acc, (l) => !output.includes(l), own);
    const order = output.map((l) => acc.labels.indexOf(l));
    const permuted = order.every((d, i) => d === i) ? acc.t : own(acc.t.permute(order));
    // the result is a tensor of its own: kept out of the cleanup below, or a copy of an operand ("ij->ij")
    if (!owned.delete(permuted)) return permuted.clone();
    return permuted;
  } finally {
    for (const t of owned) t.dispose();
  }
}

/** The size of each label; a size-1 dim broadcasts against the others (as torch), a repeated label's dims are equal. */
function labelSizes(inputs: Labelled[]): Map<string, number> {
  const sizes = new Map<string, number>();
  inputs.forEach(({ t, labels }, i) =>
    labels.forEach((l, d) => {
      const n = t.shape[d]!;
      const first = labels.indexOf(l);
      if (first !== d && t.shape[first] !== n)
        throw new OpError(op, `subscript ${l} is repeated for operand ${i} but the sizes don't match, ${t.shape[first]} != ${n}`);
      const seen = sizes.get(l);
      if (seen === undefined || seen === 1) sizes.set(l, n);
      else if (n !== 1 && n !== seen) {
        const name = l.startsWith(".") ? "an ellipsis dimension" : `subscript ${l}`;
        throw new OpError(op, `${name} has size ${n} for operand ${i} which does not broadcast with previously seen size ${seen}`);
      }
    }),
  );
  return sizes;
}

function outputLabels(rhs: string | null, inputs: Labelled[], ellipsisRank: number): string[] {
  const counts = new Map<string, number>();
  for (const { labels } of inputs) for (const l of labels) counts.set(l, (counts.get(l) ?? 0) + 1);
  const dots = Array.from({ length: ellipsisRank }, (_, j) => `.${j}`);
  if (rhs === null) return [...dots, ...[...counts.keys()].filter((l) => !l.startsWith(".") && counts.get(l) === 1).sort()];
  const out = parseTerm(rhs, null, ellipsisRank, `the output ("${rhs}")`);
  out.forEach((l, i) => {
    if (out.indexOf(l) !== i) throw new OpError(op, `output subscript ${l} appears more than once in the output`);
    if (!l.startsWith(".") && !counts.has(l)) throw new OpError(op, `output subscript ${l} does not appear in the equation for any input operand`);
  });
  return out;
}

/** Replaces each label repeated within x by the diagonal of its dims (moved last). */
function takeDiagonals(x: Labelled, own: (t: Tensor) => Tensor): Labelled {
  let { t, labels } = x;
  for (;;) {
    const j = labels.findIndex((l, k) => labels.indexOf(l) !== k);
    if (j < 0) return { t, labels };
    const i = labels.indexOf(labels[j]!); // of equal sizes (labelSizes checked)
    t = own(diagonal(t, 0, i, j));
    labels = [...labels.filter((_, k) => k !== i && k !== j), labels[i]!];
  }
}

/** Sums the dims whose label `drop` picks. */
function sumOut(x: Labelled, drop: (label: string) => boolean, own: (t: Tensor) => Tensor): Labelled {
  const dims = x.labels.map((l, d) => (drop(l) ? d : -1)).filter((d) => d >= 0);
  if (dims.length === 0) return x;
  return { t: own(sum(x.t, dims)), labels: x.labels.filter((l) => !drop(l)) };
}

/** a's and b's labels contracted by one batched matmul; the labels in `keep` survive. */
function contract(a: Labelled, b: Labelled, keep: Set<string>, sizes: Map<string, number>, own: (t: Tensor) => Tensor): Labelled {
  const shared = a.labels.filter((l) => b.labels.includes(l));
  const batch = shared.filter((l) => keep.has(l));
  const summed = shared.filter((l) => !keep.has(l));
  const left = a.labels.filter((l) => !shared.includes(l));
  const right = b.labels.filter((l) => !shared.includes(l));
  const size = (ls: string[]) => ls.map((l) => sizes.get(l)!);
  const arrange = (x: Labelled, order: string[], groups: string[][]): Tensor => {
    // broadcast size-1 dims of shared labels to the common size, then permute and merge into the matmul's 3 dims
    const full = x.labels.map((l) => sizes.get(l)!);
    const expanded = full.every((n, d) => n === x.t.shape[d]) ? x.t : own(x.t.expand(full));
    const perm = order.map((l) => x.labels.indexOf(l));
    const permuted = perm.every((d, i) => d === i) ? expanded : own(expanded.permute(perm));
    return own(permuted.reshape(groups.map((g) => numel(size(g)))));
  };
  const a3 = arrange(a, [...batch, ...left, ...summed], [batch, left, summed]);
  const b3 = arrange(b, [...batch, ...summed, ...right], [batch, summed, right]);
  const product = own(matmul(a3, b3));
  const labels = [...batch, ...left, ...right];
  return { t: own(product.reshape(size(labels))), labels };
}
