import { test } from "node:test";
import assert from "node:assert/strict";
import { niceTicks, renderLossCurveSvg } from "../../src/train/loss-curve.js";

/** Minimal XML well-formedness check: balanced tags, quoted attributes, escaped text. */
function assertWellFormedXml(xml: string): string[] {
  const body = xml.replace(/^<\?xml[^?]*\?>\s*/, "");
  const stack: string[] = [];
  const names: string[] = [];
  const tag = /<(\/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+="[^"<&]*(?:&(?:amp|lt|gt|quot|apos);[^"<&]*)*")*)\s*(\/?)>/y;
  let i = 0;
  while (i < body.length) {
    const lt = body.indexOf("<", i);
    const text = body.slice(i, lt < 0 ? body.length : lt);
    assert.equal(/&(?!(amp|lt|gt|quot|apos|#\d+);)/.test(text), false, `unescaped & in ${text}`);
    if (lt < 0) break;
    tag.lastIndex = lt;
    const m = tag.exec(body);
    assert.ok(m, `malformed tag at ${body.slice(lt, lt + 60)}`);
    const [whole, close, name, , selfClose] = m;
    if (close) assert.equal(stack.pop(), name, `mismatched </${name}>`);
    else if (!selfClose) stack.push(name!);
    names.push(name!);
    i = lt + whole.length;
  }
  assert.deepEqual(stack, [], "unclosed tags");
  assert.equal(names[0], "svg");
  return names;
}

test("loss curve SVG is well formed, with axes, ticks, both series and a legend", () => {
  const points = Array.from({ length: 200 }, (_, i) => ({
    step: i + 1,
    loss: 2 + 8 * Math.exp(-i / 30),
    valLoss: (i + 1) % 50 === 0 ? 2.3 + 8 * Math.exp(-i / 30) : undefined,
  }));
  const svg = renderLossCurveSvg(points, { title: "llama <tiny> & brown", smooth: 10 });
  const names = assertWellFormedXml(svg);
  assert.ok(names.filter((n) => n === "path").length >= 3, "train, smoothed train, validation");
  assert.match(svg, /llama &lt;tiny&gt; &amp; brown/);
  assert.match(svg, />step</);
  assert.match(svg, />loss</);
  assert.match(svg, />train</);
  assert.match(svg, />validation</);
  assert.equal((svg.match(/<circle /g) ?? []).length, 4, "one marker per validation point");
  assert.match(svg, />200</); // an x tick label
  assert.doesNotMatch(svg, /NaN|undefined|Infinity/);
});

test("edge cases: empty input, one point, log scale", () => {
  assertWellFormedXml(renderLossCurveSvg([]));
  const one = renderLossCurveSvg([{ step: 5, loss: 3 }]);
  assertWellFormedXml(one);
  assert.doesNotMatch(one, /NaN|Infinity/);
  const log = renderLossCurveSvg(
    [
      { step: 1, loss: 10 },
      { step: 2, loss: 1 },
      { step: 3, loss: Number.NaN },
    ],
    { logY: true },
  );
  assertWellFormedXml(log);
  assert.doesNotMatch(log, /NaN/);
  assert.deepEqual(niceTicks(0, 1000, 8), [0, 200, 400, 600, 800, 1000]);
  assert.deepEqual(niceTicks(2.1, 10.7, 6), [2, 4, 6, 8, 10, 12]);
});
