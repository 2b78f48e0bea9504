// torch.save's bytes for the tests, from Kiln's writer (src/util/torch-save-format.ts), whose pickles
// test/models/torch-saved-tensor.test.ts compares byte for byte with Python's (test/fixtures/torch-save/make.py).
import { storedZip, torchSaveBytes, torchSavePickle } from "../../src/util/torch-save-format.js";

/** data.pkl of a contiguous float32 tensor of `shape` in storage "0". */
export const tensorPickle = (shape: readonly number[]): Buffer => torchSavePickle({ storage: "FloatStorage", shape, bytes: new Uint8Array(0) });

/** torch.save(tensor) of a contiguous float32 tensor with these values and shape. */
export const torchSaveFloat32 = (values: Float32Array, shape: readonly number[]): Buffer =>
  torchSaveBytes({ storage: "FloatStorage", shape, bytes: new Uint8Array(values.buffer, values.byteOffset, values.byteLength) });

export { storedZip as zip };
