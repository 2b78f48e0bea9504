// Differential test: each small function runs eagerly and through every execution path compile offers (symbolic
// and dispatch capture, each as generated C and op by op; the lazy withDeferAndFuse scope, both ways), and must give
// eager's dtype, shape and values. Values are compared bit for bit (Object.is: -0 and NaN count), except where a row
// runs transcendental math in generated C (its exp / tanh / powf are not the eager kernels' polynomials: a few ulp,
// rtol 1e-6). Inputs are small dyadic numbers, so every sum is exact in any order and reductions stay bit-exact.
// Each row also names torch's result dtype, written by hand, so eager and compiled cannot agree on a wrong one.
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import * as k from "../../src/tensor/index.js";
import type { DType, Tensor } from "../../src/tensor/index.js";
import { compile, jitUnavailableReason, where, withDeferAndFuse, type Sym } from "../../src/compile/index.js";
import { foldConstants } from "../../src/compile/passes/const-fold.js";

process.env.KILN_CACHE_DIR = mkdtempSync(join(tmpdir(), "kiln-compile-dtypes-"));
const hasJit = jitUnavailableReason() === null;

type Arg = Tensor | number | boolean;
type Fn = (...args: any[]) => any;

interface Row {
  name: string;
  fn: Fn;
  args: () => Arg[];
  /** torch's result dtype(s), or an error eager raises. */
  want: DType | DType[] | RegExp;
  /** Transcendental math: generated C may differ from eager by a few ulp. */
  approx?: boolean;
  /**
   * Also run in the lazy scope with the C compiler (it compiles one program per output read, ~0.15 s each, so a
   * sample covering each op family; every row runs there op by op, and with C through compile()).
   */
  lazyC?: boolean;
  /** Uses Tensor-only methods (in-place ops): dispatch capture only. */
  eagerOnly?: boolean;
}

const t = (data: Parameters<typeof k.tensor>[0], dtype: DType) => k.tensor(data, { dtype });
const f32 = (d: Parameters<typeof k.tensor>[0]) => t(d, "float32");
const bf16 = (d: Parameters<typeof k.tensor>[0]) => t(d, "bfloat16");
const i32 = (d: number[]) => k.tensor(Int32Array.from(d));
const bool = (d: boolean[]) => t(d, "bool");
const M = [[0.5, -1.25, 3], [2, 0.75, -4]]; // [2, 3], dyadic
const MASK = [true, false, true];

const rows: Row[] = [
  // ---- binary ops with 0-d tensors: a 0-d operand only raises the category ----
  { name: "bf16[n] * f32[]", fn: (x, s) => x.mul(s), args: () => [bf16([1.5, 2, 3.25]), f32(2.5)], want: "bfloat16" },
  { name: "f32[] + bf16[n]", fn: (s, x) => s.add(x), args: () => [f32(0.1), bf16([1, 2, 300])], want: "bfloat16" },
  { name: "f32[n] * bf16[]", fn: (x, s) => x.mul(s), args: () => [f32([1.5, 2, 3.3]), bf16(0.1)], want: "float32" },
  { name: "bf16[] * f32[] (both 0-d)", fn: (s, u) => s.mul(u), args: () => [bf16(1.5), f32(0.1)], want: "float32" },
  { name: "bf16[n] * f32[1]", fn: (x, s) => x.mul(s), args: () => [bf16([1.5, 2, 3.25]), f32([0.1])], want: "float32" },
  { name: "int32[n] + f32[]", lazyC: true, fn: (x, s) => x.add(s), args: () => [i32([1, -2, 3]), f32(0.5)], want: "float32" },
  { name: "int32[n] + int64[]", lazyC: true, fn: (x, s) => x.add(s), args: () => [i32([1, -2, 3]), t(5, "int64")], want: "int32" },
  { name: "bool[n] + int32[]", fn: (x, s) => x.add(s), args: () => [bool(MASK), t(2, "int32")], want: "int32" },
  { name: "int32[n] * bool[]", fn: (x, s) => x.mul(s), args: () => [i32([1, -2, 3]), t(true, "bool")], want: "int32" },
  { name: "f32[n] / int32[]", fn: (x, s) => x.div(s), args: () => [f32([1, -2, 3]), t(3, "int32")], want: "float32" },
  { name: "int32[n] / int32[]", fn: (x, s) => x.div(s), args: () => [i32([1, -2, 3]), t(4, "int32")], want: "float32" },
  // ---- JS scalars: 16-bit floats compute in float32 and round once (opmath) ----
  { name: "bf16 / 3000", fn: (x) => x.div(3000), args: () => [bf16([300, 30, -7])], want: "bfloat16" },
  { name: "bf16 * 0.1 + 1 - 0.3", fn: (x) => x.mul(0.1).add(1).sub(0.3), args: () => [bf16([300, 30, 1.5])], want: "bfloat16" },
  { name: "bf16 scalar chain", fn: (x, s) => x.mul(s).add(s), args: () => [bf16([3, 5, 7]), 0.3], want: "bfloat16" },
  { name: "f32 * 3 + 1 (no FMA contraction)", lazyC: true, fn: (x) => x.mul(3.3).add(0.7), args: () => [f32([0.1, 1.7, -2.9, 1e-3])], want: "float32" },
  { name: "int32 + 2.5", fn: (x) => x.add(2.5), args: () => [i32([1, -2, 3])], want: "float32" },
  { name: "int32 / 2", fn: (x) => x.div(2), args: () => [i32([1, -3, 4])], want: "float32" },
  { name: "int32 * 3 - 1", fn: (x) => x.mul(3).sub(1), args: () => [i32([1, -3, 4])], want: "int32" },
  { name: "int32 ** 2", fn: (x) => x.pow(2), args: () => [i32([1, -3, 4])], want: "int32" },
  { name: "bool + 1", fn: (x) => x.add(1), args: () => [bool(MASK)], want: "int32" },
  { name: "bool * 2.5", fn: (x) => x.mul(2.5), args: () => [bool(MASK)], want: "float32" },
  { name: "bool + true", fn: (x) => x.add(true), args: () => [bool(MASK)], want: "bool" },
  { name: "bool + bool", lazyC: true, fn: (x, y) => x.add(y), args: () => [bool(MASK), bool([true, true, false])], want: "bool" },
  { name: "f32 + 0 (-0 becomes +0)", lazyC: true, fn: (x) => x.add(0), args: () => [f32([-0, 1.5, -2])], want: "float32" },
  { name: "int32 + 0, * 1 (an identity output is a copy)", lazyC: true, fn: (x) => [x.add(0), x.mul(1)], args: () => [i32([1, -2, 3])], want: ["int32", "int32"] },
  { name: "f32 - 0, / 1", fn: (x) => [x.sub(0), x.div(1)], args: () => [f32([-0, 1.5, -2])], want: ["float32", "float32"] },
  { name: "int32 ** -1 raises", fn: (x) => x.pow(-1), args: () => [i32([1, 2])], want: /Integers to negative integer powers/ },
  { name: "bool - 1 raises", fn: (x) => x.sub(1), args: () => [bool(MASK)], want: /Subtraction, the `-` operator, with a bool tensor/ },
  // ---- comparisons: bool; a JS scalar is cast to the tensor's dtype ----
  { name: "bf16 == 0.1", fn: (x) => x.eq(0.1), args: () => [bf16([0.1, 0.2, 0.1])], want: "bool" },
  { name: "f32 < f32[]", fn: (x, s) => x.lt(s), args: () => [f32([0.5, 1.5, -1]), f32(1)], want: "bool" },
  { name: "int32 >= 2.5", lazyC: true, fn: (x) => x.ge(2.5), args: () => [i32([1, 3, 2])], want: "bool" },
  { name: "bf16 > f32[]", fn: (x, s) => x.gt(s), args: () => [bf16([0.1, 0.2, 0.3]), f32(0.2)], want: "bool" },
  // ---- where: torch.result_type(a, b) ----
  { name: "where(c, bf16[n], f32[])", fn: (c, a, b) => where(c, a, b), args: () => [bool(MASK), bf16([1, 2, 3]), f32(-1.3)], want: "bfloat16" },
  { name: "where(c, int32[n], 0.5)", lazyC: true, fn: (c, a) => where(c, a, 0.5), args: () => [bool(MASK), i32([1, 2, 3])], want: "float32" },
  { name: "where(c, bf16[n], 0)", fn: (c, a) => where(c, a, 0), args: () => [bool(MASK), bf16([1.1, 2, 3])], want: "bfloat16" },
  { name: "where(c, 1, int32[n])", fn: (c, b) => where(c, 1, b), args: () => [bool(MASK), i32([4, 5, 6])], want: "int32" },
  { name: "where(c, f32[n], int64[])", fn: (c, a, b) => where(c, a, b), args: () => [bool(MASK), f32([1, 2, 3]), t(7, "int64")], want: "float32" },
  { name: "where(c, int32[n], f32[])", fn: (c, a, b) => where(c, a, b), args: () => [bool(MASK), i32([1, 2, 3]), f32(0.25)], want: "float32" },
  { name: "x.where(c, bf16[])", fn: (x, c, o) => x.where(c, o), args: () => [f32([1, 2, 3]), bool(MASK), bf16(0.1)], want: "float32" },
  // ---- reductions ----
  { name: "f32 sum / mean / max / min", fn: (x) => [x.sum(), x.sum(-1), x.mean(-1, true), x.max(-1), x.min()], args: () => [f32(M)], want: ["float32", "float32", "float32", "float32", "float32"] },
  { name: "f32 max / min propagate NaN", lazyC: true, fn: (x) => [x.max(-1), x.min(-1)], args: () => [f32([[1, NaN, 3], [2, 0.5, -1]])], want: ["float32", "float32"] },
  { name: "bf16 sum / mean / max", fn: (x) => [x.sum(-1), x.mean(), x.max(-1)], args: () => [bf16(M)], want: ["bfloat16", "bfloat16", "bfloat16"] },
  { name: "bf16 mean rounds once", fn: (x) => x.mean(-1), args: () => [k.full([2, 1500], 0.1, { dtype: "bfloat16" })], want: "bfloat16" },
  { name: "int32 sum / max", fn: (x) => [x.sum(-1), x.max(-1)], args: () => [k.tensor(Int32Array.of(1, -2, 3, 4, 5, -6), { shape: [2, 3] })], want: ["int32", "int32"] },
  { name: "bool sum", fn: (x) => x.sum(), args: () => [bool(MASK)], want: "int32" },
  { name: "int32 mean raises", fn: (x) => x.mean(), args: () => [i32([1, 2, 4])], want: /could not infer output dtype.*Got: int32/ },
  // ---- softmax / log_softmax keep a float dtype ----
  { name: "f32 softmax, log_softmax", fn: (x) => [x.softmax(-1), x.logSoftmax(-1)], args: () => [f32(M)], want: ["float32", "float32"], approx: true },
  { name: "bf16 softmax, log_softmax", fn: (x) => [x.softmax(-1), x.logSoftmax(-1)], args: () => [bf16(M)], want: ["bfloat16", "bfloat16"] },
  { name: "bf16 softmax * 0-d f32", fn: (x, s) => x.softmax(-1).mul(s), args: () => [bf16(M), f32(3)], want: "bfloat16" },
  { name: "int32 softmax", lazyC: true, fn: (x) => x.softmax(-1), args: () => [k.tensor(Int32Array.of(1, 2, 3, -1, 0, 4), { shape: [2, 3] })], want: "float32", approx: true },
  // ---- matmul (float32 out, as eager) ----
  { name: "f32 @ f32", lazyC: true, fn: (a, b) => a.matmul(b), args: () => [f32(M), f32([[1, 0.5], [-2, 0.25], [0.5, 1]])], want: "float32" },
  { name: "bf16 @ f32", fn: (a, b) => a.matmul(b), args: () => [bf16(M), f32([[1, 0.5], [-2, 0.25], [0.5, 1]])], want: "float32" },
  { name: "int32 @ f32", fn: (a, b) => a.matmul(b), args: () => [k.tensor(Int32Array.of(1, 2, 3, 4), { shape: [2, 2] }), f32([[1, 0.5], [-2, 0.25]])], want: "float32" },
  // ---- casts ----
  { name: "f32 -> int32 / bf16 / bool", fn: (x) => [x.to("int32"), x.to("bfloat16"), x.to("bool")], args: () => [f32([-2.7, 0, 0.1, 3.9])], want: ["int32", "bfloat16", "bool"] },
  { name: "bf16 -> f32 -> * 0.1", fn: (x) => x.to("float32").mul(0.1), args: () => [bf16([0.1, 3, -7])], want: "float32" },
  { name: "f32 -> int32 / int64 / int8 of NaN, inf, out of range (torch x86: the minimum)", lazyC: true, fn: (x) => [x.to("int32"), x.to("int64"), x.to("int8")], args: () => [f32([NaN, Infinity, -Infinity, 3e9, -3e9, -2.5])], want: ["int32", "int64", "int8"] },
  { name: "int32 -> bool, bool -> f32", lazyC: true, fn: (x, c) => [x.to("bool"), c.to("float32")], args: () => [i32([0, 2, -1]), bool(MASK)], want: ["bool", "float32"] },
  // ---- unary math ----
  { name: "int32 neg / abs / relu / square keep int32", fn: (x) => [x.neg(), x.abs(), x.relu(), x.square()], args: () => [i32([1, -2, 3])], want: ["int32", "int32", "int32", "int32"] },
  { name: "int32 square / mul / pow wrap modulo 2^32", lazyC: true, fn: (x, y) => [x.square(), x.mul(x), x.pow(3), x.pow(y)], args: () => [i32([2147483647, 65536, 46341, -3]), i32([40, 31, 20, -1])], want: ["int32", "int32", "int32", "int32"] },
  { name: "int32 past 2^24 with f32: cast to float32 first", fn: (x, y) => [x.add(y), x.eq(y), x.sqrt()], args: () => [i32([16777217, 2147483647, 3]), f32([0.5, 2147483648, 1])], want: ["float32", "bool", "float32"] },
  { name: "int32 exp / sqrt -> f32", fn: (x) => [x.exp(), x.sqrt()], args: () => [i32([1, 4, 9])], want: ["float32", "float32"], approx: true },
  { name: "f32 exp / tanh / sigmoid / silu", fn: (x) => [x.exp(), x.tanh(), x.sigmoid(), x.silu()], args: () => [f32([0.5, -1.25, 3])], want: ["float32", "float32", "float32", "float32"], approx: true },
  { name: "bf16 exp / silu / neg", fn: (x) => [x.exp(), x.silu(), x.neg()], args: () => [bf16([0.5, -1.25, 3])], want: ["bfloat16", "bfloat16", "bfloat16"] },
  { name: "bool neg raises", fn: (x) => x.neg(), args: () => [bool(MASK)], want: /Negation, the `-` operator, on a bool tensor/ },
  // ---- in place (dispatch capture records them; Syms have no in-place methods) ----
  { name: "bf16 y.add_(0.1)", fn: (x) => x.mul(2).add_(0.1), args: () => [bf16([3, 5, 300])], want: "bfloat16", eagerOnly: true },
  { name: "bf16 y.mul_(f32[])", fn: (x, s) => x.add(1).mul_(s), args: () => [bf16([3, 5, 300]), f32(0.1)], want: "bfloat16", eagerOnly: true },
  { name: "f32 y.div_(3)", fn: (x) => x.mul(2).div_(3), args: () => [f32([1, 5, -7])], want: "float32", eagerOnly: true },
];

type Path = "symbolic" | "dispatch" | "lazy";
const PATHS: Path[] = ["symbolic", "dispatch", "lazy"];
type Outcome = { outs: Tensor[]; jit: boolean | null } | { error: unknown };

function withoutCompiler<T>(fn: () => T): T {
  const prev = process.env.KILN_CC;
  process.env.KILN_CC = "/nonexistent-cc";
  try {
    return fn();
  } finally {
    if (prev === undefined) delete process.env.KILN_CC;
    else process.env.KILN_CC = prev;
  }
}

function attempt(fn: () => { outs: Tensor[]; jit: boolean | null }): Outcome {
  try {
    return fn();
  } catch (error) {
    return { error };
  }
}

const inputs = new Map<Row, Arg[]>(rows.map((r) => [r, r.args()]));
const listOf = (r: unknown): Tensor[] => (Array.isArray(r) ? r : [r]) as Tensor[];

/** The lazy scope: inputs wrapped with lazy(), each output read back (one program per output). */
function runLazy(row: Row): { outs: Tensor[]; jit: null } {
  const args = inputs.get(row)!;
  const outs = withDeferAndFuse((lazy) => (listOf(row.fn(...args.map((a) => (a instanceof k.Tensor ? lazy(a) : a)))) as unknown as Sym[]).map((o) => o.toTensor()));
  return { outs, jit: null };
}

/**
 * compile() of a batch of rows as one function (one program: one C compile per path instead of one per row; the
 * rows' graphs are disjoint, so each keeps the kernels it has alone). Outputs are split back per row.
 */
function runBatch(batch: Row[], capture: "symbolic" | "dispatch"): Map<Row, Outcome> {
  const spans: [Row, number, number][] = [];
  const flat: Arg[] = [];
  for (const row of batch) {
    spans.push([row, flat.length, inputs.get(row)!.length]);
    flat.push(...inputs.get(row)!);
  }
  const counts: number[] = [];
  const fn = (...args: Arg[]) =>
    spans.flatMap(([row, at, n]) => {
      const outs = listOf(row.fn(...args.slice(at, at + n)));
      counts.push(outs.length);
      return outs;
    });
  const f = compile(fn, { capture });
  const all = f(...flat) as Tensor[];
  const res = new Map<Row, Outcome>();
  let o = 0;
  spans.forEach(([row], i) => {
    res.set(row, { outs: all.slice(o, o + counts[i]!), jit: f.lastInfo!.jit });
    o += counts[i]!;
  });
  return res;
}

const floats16 = (row: Row) =>
  inputs.get(row)!.some((a) => a instanceof k.Tensor && (a.dtype === "bfloat16" || a.dtype === "float16")) ||
  (Array.isArray(row.want) ? row.want : [row.want]).includes("bfloat16");

/** Outcome of every row on one path; rows of float32 / integer / bool dtypes are compiled as one batch. */
const memo = new Map<string, Map<Row, Outcome>>();
function outcome(row: Row, path: Path, withCompiler: boolean): Outcome {
  const run = withCompiler ? <T>(fn: () => T) => fn() : withoutCompiler;
  if (path === "lazy") return attempt(() => run(() => runLazy(row)));
  const key = `${path}:${withCompiler}`;
  let got = memo.get(key);
  if (!got) {
    const mine = rows.filter((r) => !(r.eagerOnly && path !== "dispatch"));
    const batch = mine.filter((r) => !(r.want instanceof RegExp) && !floats16(r));
    got = run(() => runBatch(batch, path));
    for (const r of mine) {
      if (got.has(r)) continue;
      got.set(r, attempt(() => run(() => {
        const f = compile(r.fn, { capture: path });
        return { outs: listOf(f(...inputs.get(r)!)), jit: f.lastInfo!.jit };
      })));
    }
    memo.set(key, got);
  }
  return got.get(row)!;
}

/** Bit-for-bit equality of two value lists (Object.is: NaN equals NaN, -0 differs from +0). */
function sameBits(got: number[], want: number[], msg: string): void {
  assert.equal(got.length, want.length, msg);
  for (let i = 0; i < want.length; i++) assert.ok(Object.is(got[i], want[i]), `${msg} [${i}]: got ${got[i]}, eager ${want[i]}`);
}

function close(got: number[], want: number[], msg: string): void {
  assert.equal(got.length, want.length, msg);
  for (let i = 0; i < want.length; i++) assert.ok(Math.abs(got[i]! - want[i]!) <= 1e-6 * Math.abs(want[i]!) + 1e-7, `${msg} [${i}]: got ${got[i]}, eager ${want[i]}`);
}

describe("compile: eager dtype semantics on every path", () => {
  for (const row of rows) {
    it(row.name, () => {
      const args = inputs.get(row)!;
      const paths = PATHS.filter((p) => !(row.eagerOnly && p !== "dispatch"));
      if (row.want instanceof RegExp) {
        assert.throws(() => row.fn(...args), row.want, "eager");
        for (const path of paths) {
          for (const c of [true, false]) {
            if (path === "lazy" && c && !row.lazyC) continue;
            const r = outcome(row, path, c);
            assert.ok("error" in r, `${path}: expected an error`);
            assert.match(String((r.error as Error).message), row.want, path);
          }
        }
        return;
      }
      const eager = listOf(row.fn(...args));
      const wantDtypes = Array.isArray(row.want) ? row.want : [row.want];
      assert.deepEqual(eager.map((e) => e.dtype), wantDtypes, "eager dtypes (torch's)");
      for (const path of paths) {
        for (const c of [true, false]) {
          if (path === "lazy" && c && !row.lazyC && !floats16(row)) continue;
          const label = `${path}${c ? "" : " op by op"}`;
          const r = outcome(row, path, c);
          if ("error" in r) throw r.error;
          const { outs, jit } = r;
          // generated C really ran where its dtypes allow (16-bit float kernels run op by op)
          if (c && hasJit && jit !== null && !floats16(row)) assert.equal(jit, true, `${label}: expected generated code`);
          if (!c && jit !== null) assert.equal(jit, false, label);
          assert.equal(outs.length, eager.length, label);
          outs.forEach((o, j) => {
            const msg = `${label} output ${j}`;
            assert.equal(o.dtype, eager[j]!.dtype, `${msg} dtype`);
            assert.deepEqual(o.shape, eager[j]!.shape, `${msg} shape`);
            if (row.approx && c && jit !== false) close(o.toList(), eager[j]!.toList(), msg);
            else sameBits(o.toList(), eager[j]!.toList(), msg);
          });
        }
      }
    });
  }
});

describe("compile: hand-checked values on the compiled path", () => {
  it("bf16 / 3000 is bf16(0.1), not x / bf16(3000); bf16[n] * f32[] stays bf16", () => {
    const f = compile((x: Sym, s: Sym) => [x.div(3000), x.mul(s)]);
    const [q, p] = f(bf16([300, 3]), f32(2.5)) as Tensor[];
    assert.deepEqual([q!.dtype, p!.dtype], ["bfloat16", "bfloat16"]);
    assert.equal(q!.toList()[0], 0.10009765625); // bf16(0.1); 300 / 3008 rounds to 0.099609375
    assert.deepEqual(p!.toList(), [752, 7.5]); // 750 has 9 significant bits: bf16 rounds it to even, 752
  });

  it("true + true is true and x + 0 turns -0 into +0 in generated code", { skip: hasJit ? false : "no C compiler" }, () => {
    const f = compile((b: Sym, x: Sym) => [b.add(b), x.add(0)]);
    const [s, z] = f(bool([true, false]), f32([-0, 2])) as Tensor[];
    assert.equal(f.lastInfo!.jit, true);
    assert.deepEqual(s!.toList(), [1, 0]);
    assert.ok(Object.is(z!.toList()[0], 0));
  });

  it("constant folding computes as the kernels: C's pow (1 ** NaN is 1), int32 mul / pow wrap, NaN cast to int32 is -2^31", () => {
    const c = (id: number, value: number, dtype: DType) => ({ id, op: { kind: "const" as const, value }, shape: [], dtype });
    const bin = (id: number, fn: "pow" | "mul", a: number, b: number, dtype: DType) => ({ id, op: { kind: "binary" as const, fn, a, b }, shape: [], dtype });
    const g = foldConstants({
      nodes: [
        c(0, 1, "float32"), c(1, NaN, "float32"), bin(2, "pow", 0, 1, "float32"),
        c(3, 2147483647, "int32"), bin(4, "mul", 3, 3, "int32"), bin(5, "pow", 3, 3, "int32"),
        { id: 6, op: { kind: "cast", x: 1 }, shape: [], dtype: "int32" },
      ],
      outputs: [2, 4, 5, 6], numInputs: 0, numParams: 0,
    });
    // JS's 1 ** NaN is NaN; (2^31 - 1)^2 rounded in float64 stored 0; the NaN cast gave NaN, rendered as "(int32_t)NaN"
    assert.deepEqual([2, 4, 5, 6].map((id) => g.nodes[id]!.op), [1, 1, 2147483647, -(2 ** 31)].map((value) => ({ kind: "const", value })));
  });

  it("autograd: compiled and lazy functions refuse inputs that require grad (no backward is recorded); noGrad runs them", () => {
    const x = bf16([1.5, -2]).requiresGrad_();
    const f = compile((a: Sym) => a.mul(2));
    assert.throws(() => f(x), (e: Error) => e.name === "UnsupportedError" && /do not record autograd/.test(e.message));
    assert.throws(() => withDeferAndFuse((lazy) => lazy(x).mul(2).toTensor()), /records no autograd/);
    const y = k.noGrad(() => f(x) as Tensor);
    assert.deepEqual([y.dtype, y.toList()], ["bfloat16", [3, -4]]);
  });
});
