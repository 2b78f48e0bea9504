// kiln.save / kiln.load (torch.save / torch.load(weights_only=True)): Kiln's pickle of a state dict is byte for byte
// what Python's pickler writes for it (test/fixtures/torch-save/make.py), files round-trip every dtype, torch's own
// files load (views gathered), Python reads Kiln's file back through its own pickle and zipfile modules, and anything
// but tensors is refused.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Linear, Sequential, Tanh } from "../../src/nn/index.js";
import * as k from "../../src/tensor/index.js";
import { torchSavePickle } from "../../src/util/torch-save-format.js";
import { tempPath } from "../helpers/tiny-model.js";

const fixtures = fileURLToPath(new URL("../../../test/fixtures/torch-save/", import.meta.url));
const python = spawnSync("python3", ["--version"]).status === 0;

/** The stored data.pkl of a torch.save zip, found by its local header. */
function dataPkl(file: string): Buffer {
  const bytes = fs.readFileSync(file);
  const name = Buffer.from("archive/data.pkl");
  const at = bytes.indexOf(name);
  return bytes.subarray(at + name.length, at + name.length + bytes.readUInt32LE(at - 30 + 18));
}

describe("kiln.save / kiln.load", () => {
  it("a state dict pickles as Python's pickler writes it", () => {
    const mine = torchSavePickle(new Map([
      ["w", { storage: "FloatStorage", shape: [2, 3], bytes: new Uint8Array(0) }],
      ["b", { storage: "BFloat16Storage", shape: [2], bytes: new Uint8Array(0) }],
    ]));
    assert.deepEqual(mine, dataPkl(path.join(fixtures, "state-dict-plain.bin")));
  });

  it("every dtype round-trips; a transposed view is saved by its values", () => {
    const file = tempPath("roundtrip.pt");
    const x = k.tensor(Float32Array.from([1, -2.5, 3, 0.125, 5, -6]), { shape: [2, 3] });
    const state = new Map<string, k.Tensor>([
      ["f32", x], ["bf16", x.to("bfloat16")], ["f16", x.to("float16")], ["i32", k.tensor(Int32Array.from([7, -8]))],
      ["i64", k.tensor(Int32Array.from([1, 2, 3])).to("int64")], ["u8", k.tensor(Uint8Array.from([0, 255]), { dtype: "uint8" })],
      ["bool", x.gt(0)], ["t", x.transpose(0, 1)],
    ]);
    k.save(state, file);
    const back = k.load(file) as Map<string, k.Tensor>;
    assert.deepEqual([...back.keys()], [...state.keys()]);
    for (const [name, t] of state) {
      const b = back.get(name)!;
      assert.equal(b.dtype, t.dtype, name);
      assert.deepEqual(b.shape, t.shape, name);
      assert.deepEqual(b.toList(), t.toList(), name);
    }
    k.save(x, file);
    assert.deepEqual((k.load(file) as k.Tensor).toList(), x.toList());
  });

  it("torch's files load: a float16 view gathered, a state dict with a tied and an offset view; non-tensors refused", () => {
    const t = k.load(path.join(fixtures, "f16-transposed.pt")) as k.Tensor;
    assert.equal(t.dtype, "float16");
    assert.deepEqual(t.toList(), [1, 4, 2, 5, 3, 6]);
    const plain = k.load(path.join(fixtures, "state-dict-plain.bin")) as Map<string, k.Tensor>;
    assert.deepEqual(plain.get("w")!.toList(), [1, 2, 3, 4, 5, 6]);
    assert.deepEqual(plain.get("b")!.toList(), [0.5, -3]);
    assert.throws(() => k.load(path.join(fixtures, "state-dict.bin")), /state-dict\.bin \(step\): holds something other than a tensor/);
    assert.throws(() => k.load(path.join(fixtures, "out-of-bounds.pt")), /the view reaches element 5 of a storage of 4/);
  });

  it("a module's state dict saved and loaded into a fresh module gives the same outputs", () => {
    k.manualSeed(5);
    const a = new Sequential(new Linear(3, 4, true), new Tanh(), new Linear(4, 2, true));
    const b = new Sequential(new Linear(3, 4, true), new Tanh(), new Linear(4, 2, true));
    const file = tempPath("module.pt");
    k.save(a.stateDict(), file);
    b.loadStateDict(k.load(file) as Map<string, k.Tensor>);
    const x = k.randn([5, 3]);
    assert.deepEqual(b.forward(x).toList(), a.forward(x).toList());
  });

  it("Python's pickle and zipfile read Kiln's file (torch's rebuild called with Kiln's storage, size and stride)", { skip: python ? false : "python3 is not installed" }, () => {
    const file = tempPath("for-python.pt");
    k.save(new Map([["w", k.tensor(Float32Array.from([1, 2, 3, 4, 5, 6]), { shape: [3, 2] })], ["b", k.tensor(Float32Array.from([-1, 0.5])).to("bfloat16")]]), file);
    const script = `
import collections, json, pickle, struct, sys, types, zipfile
torch = types.ModuleType("torch"); utils = types.ModuleType("torch._utils")
sys.modules["torch"] = torch; sys.modules["torch._utils"] = utils
for n in ("FloatStorage", "BFloat16Storage"): setattr(torch, n, type(n, (), {}))
z = zipfile.ZipFile(sys.argv[1])
def rebuild(storage, offset, size, stride, requires_grad, hooks):
    kind, key = storage
    raw = z.read("archive/data/" + key)
    vals = struct.unpack("<%df" % (len(raw) // 4), raw) if kind == "FloatStorage" else [struct.unpack("<f", b"\\0\\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    return {"size": list(size), "stride": list(stride), "values": list(vals)}
utils._rebuild_tensor_v2 = rebuild
class U(pickle.Unpickler):
    def persistent_load(self, pid):
        return (pid[1].__name__, pid[2])
state = U(z.open("archive/data.pkl")).load()
print(json.dumps({k: v for k, v in state.items()}))
`;
    const r = spawnSync("python3", ["-c", script, file], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), {
      w: { size: [3, 2], stride: [2, 1], values: [1, 2, 3, 4, 5, 6] },
      b: { size: [2], stride: [1], values: [-1, 0.5] },
    });
  });
});
