// Loss curve as a standalone SVG line chart: train loss (every logged step), validation loss (the
// steps that have one), "nice" axis ticks, axis labels and a legend. No dependencies.

export interface LossPoint {
  step: number;
  loss?: number; // train loss; may be absent on a validation-only point
  valLoss?: number;
}

export interface LossCurveOptions {
  width?: number; // px, default 800
  height?: number; // px, default 480
  title?: string;
  /** Log-scale y axis (default false). */
  logY?: boolean;
  /** Moving-average window over train points drawn on top of the raw series (default 0: none). */
  smooth?: number;
}

const TRAIN_COLOR = "#1f77b4";
const SMOOTH_COLOR = "#0b3c66";
const VAL_COLOR = "#d62728";

/**
 * Renders points as an SVG document string.
 * @example
 *   writeFileSync("loss.svg", renderLossCurveSvg([{ step: 1, loss: 9.1 }, { step: 100, loss: 4.2, valLoss: 4.5 }], { title: "llama tiny" }));
 */
export function renderLossCurveSvg(points: LossPoint[], opts: LossCurveOptions = {}): string {
  const W = opts.width ?? 800;
  const H = opts.height ?? 480;
  const m = { left: 70, right: 20, top: opts.title ? 40 : 20, bottom: 55 };
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const logY = opts.logY ?? false;
  const ok = (v: number | undefined): v is number => v !== undefined && Number.isFinite(v) && (!logY || v > 0);
  const pts = [...points].filter((p) => Number.isFinite(p.step)).sort((a, b) => a.step - b.step);
  const train = pts.filter((p) => ok(p.loss)).map((p) => [p.step, p.loss!] as const);
  const val = pts.filter((p) => ok(p.valLoss)).map((p) => [p.step, p.valLoss!] as const);
  const smooth = opts.smooth && opts.smooth > 1 ? movingAverage(train, opts.smooth) : [];

  const xs = [...train, ...val].map((p) => p[0]);
  const ys = [...train, ...val].map((p) => p[1]);
  let [x0, x1] = xs.length ? [Math.min(...xs), Math.max(...xs)] : [0, 1];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  const fy = (v: number): number => (logY ? Math.log10(v) : v);
  let [y0, y1] = ys.length ? [Math.min(...ys.map(fy)), Math.max(...ys.map(fy))] : [0, 1];
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const xTicks = niceTicks(x0, x1, 8);
  const yTicks = logY ? logTicks(y0, y1) : niceTicks(y0, y1, 6);
  // Axes span the tick range so the outermost ticks sit on the frame.
  x0 = Math.min(x0, xTicks[0]!);
  x1 = Math.max(x1, xTicks[xTicks.length - 1]!);
  y0 = Math.min(y0, yTicks[0]!);
  y1 = Math.max(y1, yTicks[yTicks.length - 1]!);
  const sx = (x: number): number => m.left + ((x - x0) / (x1 - x0)) * pw;
  const sy = (y: number): number => m.top + ph - ((fy(y) - y0) / (y1 - y0)) * ph;
  const syRaw = (t: number): number => m.top + ph - ((t - y0) / (y1 - y0)) * ph;

  const out: string[] = [];
  out.push(`<?xml version="1.0" encoding="UTF-8"?>`);
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
  );
  out.push(`<rect x="0" y="0" width="${W}" height="${H}" fill="#ffffff"/>`);
  if (opts.title) out.push(`<text x="${W / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">${esc(opts.title)}</text>`);
  // Grid and ticks.
  out.push(`<g stroke="#e0e0e0" stroke-width="1">`);
  for (const t of xTicks) out.push(`<line x1="${f(sx(t))}" y1="${m.top}" x2="${f(sx(t))}" y2="${m.top + ph}"/>`);
  for (const t of yTicks) out.push(`<line x1="${m.left}" y1="${f(syRaw(t))}" x2="${m.left + pw}" y2="${f(syRaw(t))}"/>`);
  out.push(`</g>`);
  out.push(`<g fill="#333333">`);
  for (const t of xTicks) out.push(`<text x="${f(sx(t))}" y="${m.top + ph + 18}" text-anchor="middle">${fmtTick(t)}</text>`);
  for (const t of yTicks)
    out.push(`<text x="${m.left - 8}" y="${f(syRaw(t) + 4)}" text-anchor="end">${logY ? fmtTick(10 ** t) : fmtTick(t)}</text>`);
  out.push(`</g>`);
  out.push(`<rect x="${m.left}" y="${m.top}" width="${pw}" height="${ph}" fill="none" stroke="#333333"/>`);
  // Axis labels.
  out.push(`<text x="${m.left + pw / 2}" y="${H - 12}" text-anchor="middle" font-size="13">step</text>`);
  out.push(
    `<text x="18" y="${m.top + ph / 2}" text-anchor="middle" font-size="13" transform="rotate(-90 18 ${m.top + ph / 2})">loss${logY ? " (log)" : ""}</text>`,
  );
  // Series.
  const path = (s: readonly (readonly [number, number])[]): string =>
    s.map(([x, y], i) => `${i === 0 ? "M" : "L"}${f(sx(x))},${f(sy(y))}`).join(" ");
  if (train.length > 0)
    out.push(
      `<path d="${path(train)}" fill="none" stroke="${TRAIN_COLOR}" stroke-width="1.5" stroke-opacity="${smooth.length ? 0.45 : 1}"/>`,
    );
  if (smooth.length > 0) out.push(`<path d="${path(smooth)}" fill="none" stroke="${SMOOTH_COLOR}" stroke-width="2"/>`);
  if (val.length > 0) {
    out.push(`<path d="${path(val)}" fill="none" stroke="${VAL_COLOR}" stroke-width="2"/>`);
    out.push(`<g fill="${VAL_COLOR}">`);
    for (const [x, y] of val) out.push(`<circle cx="${f(sx(x))}" cy="${f(sy(y))}" r="3"/>`);
    out.push(`</g>`);
  }
  // Legend (top right, inside the plot).
  const entries: [string, string][] = [];
  if (train.length > 0) entries.push(["train", TRAIN_COLOR]);
  if (smooth.length > 0) entries.push([`train (avg ${opts.smooth})`, SMOOTH_COLOR]);
  if (val.length > 0) entries.push(["validation", VAL_COLOR]);
  if (entries.length > 0) {
    const lw = 150;
    const lx = m.left + pw - lw - 10;
    const ly = m.top + 10;
    out.push(`<g>`);
    out.push(
      `<rect x="${lx}" y="${ly}" width="${lw}" height="${entries.length * 20 + 10}" fill="#ffffff" fill-opacity="0.9" stroke="#999999"/>`,
    );
    entries.forEach(([label, color], i) => {
      const y = ly + 20 + i * 20;
      out.push(`<line x1="${lx + 10}" y1="${y - 4}" x2="${lx + 40}" y2="${y - 4}" stroke="${color}" stroke-width="2"/>`);
      out.push(`<text x="${lx + 48}" y="${y}">${esc(label)}</text>`);
    });
    out.push(`</g>`);
  }
  if (train.length === 0 && val.length === 0)
    out.push(`<text x="${m.left + pw / 2}" y="${m.top + ph / 2}" text-anchor="middle" fill="#999999">no data</text>`);
  out.push(`</svg>`);
  return out.join("\n") + "\n";
}

/** 1-2-5 ticks covering [lo, hi] with about `count` intervals. */
export function niceTicks(lo: number, hi: number, count: number): number[] {
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((k) => k * mag).find((s) => s >= raw) ?? 10 * mag;
  const start = Math.floor(lo / step + 1e-9) * step;
  const ticks: number[] = [];
  for (let t = start; t <= hi + step * 0.999; t += step) ticks.push(Number(t.toPrecision(12)));
  return ticks;
}

/** Log-axis ticks (as log10 values) at 1-2-5 (or 1-2-3-5 within one decade), one tick past each end. */
function logTicks(lo: number, hi: number): number[] {
  const mults = hi - lo <= 1 ? [1, 2, 3, 5] : hi - lo <= 3 ? [1, 2, 5] : [1];
  const cands: number[] = [];
  for (let d = Math.floor(lo) - 1; d <= Math.ceil(hi) + 1; d++) for (const k of mults) cands.push(d + Math.log10(k));
  let first = 0;
  while (first + 1 < cands.length && cands[first + 1]! <= lo + 1e-9) first++;
  const last = cands.findIndex((t) => t >= hi - 1e-9);
  return cands.slice(first, last + 1);
}

function movingAverage(s: readonly (readonly [number, number])[], w: number): [number, number][] {
  const out: [number, number][] = [];
  let sum = 0;
  for (let i = 0; i < s.length; i++) {
    sum += s[i]![1];
    if (i >= w) sum -= s[i - w]![1];
    out.push([s[i]![0], sum / Math.min(i + 1, w)]);
  }
  return out;
}

function fmtTick(v: number): string {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) return v.toExponential(1);
  if (a >= 1000 && Number.isInteger(v)) return v >= 1e4 ? `${v / 1000}k` : String(v);
  return String(Number(v.toPrecision(4)));
}

const f = (v: number): string => (Math.round(v * 100) / 100).toString();

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}
