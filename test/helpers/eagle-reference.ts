// A slow, readable pure-TS EAGLE head (float64 on the host), to check the proposer against: vLLM's layout, position p
// reads (token p + 1, the served model's hidden state at p) and proposes token p + 2; drafts after the first feed
// the head's own output back.
import { readSafetensors } from "../../src/models/formats/safetensors.js";

export interface RefConfig {
  method: "eagle" | "eagle3";
  hidden: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  eps: number;
  theta: number;
  layers: number;
}

type W = (name: string) => Float64Array;

/** Every tensor of a safetensors directory, as float64, by name. */
export function readWeights(dir: string): W {
  const h = readSafetensors(dir);
  const all = new Map(h.tensors.map((t) => [t.name, Float64Array.from(h.loadAsFloat32(t.name))]));
  h.close();
  return (n) => {
    const v = all.get(n);
    if (v === undefined) throw new Error(`no tensor ${n}`);
    return v;
  };
}

const matvec = (w: Float64Array, x: Float64Array): Float64Array => {
  const out = new Float64Array(w.length / x.length);
  for (let o = 0; o < out.length; o++) {
    let s = 0;
    for (let i = 0; i < x.length; i++) s += w[o * x.length + i]! * x[i]!;
    out[o] = s;
  }
  return out;
};
const rms = (x: Float64Array, w: Float64Array, eps: number) => {
  let ss = 0;
  for (const v of x) ss += v * v;
  const r = 1 / Math.sqrt(ss / x.length + eps);
  return x.map((v, i) => v * r * w[i]!);
};
const plus = (a: Float64Array, b: Float64Array) => a.map((v, i) => v + b[i]!);
const argmax = (x: Float64Array) => x.reduce((best, v, i) => (v > x[best]! ? i : best), 0);

/** HF's rotate-half rotary on each head of `x` [n * D] at position p. */
function rope(x: Float64Array, n: number, D: number, p: number, theta: number): Float64Array {
  const out = Float64Array.from(x);
  for (let h = 0; h < n; h++)
    for (let i = 0; i < D / 2; i++) {
      const a = p / Math.pow(theta, (2 * i) / D);
      const x0 = x[h * D + i]!, x1 = x[h * D + i + D / 2]!;
      out[h * D + i] = x0 * Math.cos(a) - x1 * Math.sin(a);
      out[h * D + i + D / 2] = x1 * Math.cos(a) + x0 * Math.sin(a);
    }
  return out;
}

/**
 * The head's greedy drafts for `tokens` (N of them) from the served model's rows h[0 .. N-2] (EAGLE-3: the three aux
 * streams side by side): k drafts. `head`: the head's weights; `target`: the served model's (embeddings, LM head).
 */
export function referenceDrafts(c: RefConfig, head: W, target: W, tokens: readonly number[], rows: readonly Float64Array[], k: number, d2t: readonly number[] | null = null): number[] {
  const { hidden: H, heads: nH, kvHeads: nKv, headDim: D } = c;
  const embed = target("model.embed_tokens.weight");
  const E = (t: number) => embed.slice(t * H, (t + 1) * H);
  const cache: { k: Float64Array; v: Float64Array }[][] = Array.from({ length: c.layers }, () => []); // [layer][position]
  const attend = (l: number, prefix: string, x: Float64Array, p: number): Float64Array => {
    const q = rope(matvec(head(`${prefix}.self_attn.q_proj.weight`), x), nH, D, p, c.theta);
    cache[l]![p] = { k: rope(matvec(head(`${prefix}.self_attn.k_proj.weight`), x), nKv, D, p, c.theta), v: matvec(head(`${prefix}.self_attn.v_proj.weight`), x) };
    const o = new Float64Array(nH * D);
    for (let h = 0; h < nH; h++) {
      const g = Math.floor(h / (nH / nKv));
      const scores = Array.from({ length: p + 1 }, (_, s) => {
        let dot = 0;
        for (let i = 0; i < D; i++) dot += q[h * D + i]! * cache[l]![s]!.k[g * D + i]!;
        return dot / Math.sqrt(D);
      });
      const m = Math.max(...scores);
      const e = scores.map((s) => Math.exp(s - m));
      const z = e.reduce((a, b) => a + b, 0);
      for (let s = 0; s <= p; s++) for (let i = 0; i < D; i++) o[h * D + i] += (e[s]! / z) * cache[l]![s]!.v[g * D + i]!;
    }
    return matvec(head(`${prefix}.self_attn.o_proj.weight`), o);
  };
  const mlp = (prefix: string, x: Float64Array) => {
    const g = matvec(head(`${prefix}.mlp.gate_proj.weight`), x);
    const u = matvec(head(`${prefix}.mlp.up_proj.weight`), x);
    return matvec(head(`${prefix}.mlp.down_proj.weight`), g.map((v, i) => (v / (1 + Math.exp(-v))) * u[i]!));
  };
  // one position: (token, hidden input [H]) -> (greedy token, output hidden)
  const step = (p: number, token: number, h: Float64Array): [number, Float64Array] => {
    if (c.method === "eagle") {
      let x = matvec(head("fc.weight"), Float64Array.from([...E(token), ...h]));
      for (let l = 0; l < c.layers; l++) {
        const prefix = `layers.${l}`;
        x = plus(x, attend(l, prefix, l === 0 ? x : rms(x, head(`${prefix}.input_layernorm.weight`), c.eps), p));
        x = plus(x, mlp(prefix, rms(x, head(`${prefix}.post_attention_layernorm.weight`), c.eps)));
      }
      return [argmax(matvec(target("lm_head.weight"), x)), x];
    }
    const e = rms(E(token), head("midlayer.input_layernorm.weight"), c.eps);
    const hn = rms(h, head("midlayer.hidden_norm.weight"), c.eps);
    let r = plus(h, attend(0, "midlayer", Float64Array.from([...e, ...hn]), p));
    r = plus(r, mlp("midlayer", rms(r, head("midlayer.post_attention_layernorm.weight"), c.eps)));
    const d = argmax(matvec(head("lm_head.weight"), rms(r, head("norm.weight"), c.eps)));
    return [d + (d2t?.[d] ?? 0), r];
  };
  const N = tokens.length;
  let out: [number, Float64Array] = [-1, new Float64Array(0)];
  for (let p = 0; p <= N - 2; p++) out = step(p, tokens[p + 1]!, c.method === "eagle3" ? matvec(head("fc.weight"), rows[p]!) : rows[p]!);
  const drafts = [out[0]];
  for (let j = 2; j <= k; j++) {
    out = step(N - 3 + j, drafts[j - 2]!, out[1]);
    drafts.push(out[0]);
  }
  return drafts;
}
