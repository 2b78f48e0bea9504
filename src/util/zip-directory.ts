// The entries of a zip archive (what torch.save writes: stored entries, zip64 past 4 GiB), found from its central
// directory through a byte reader, so a multi-gigabyte checkpoint is never read whole: each entry's data is located
// (its byte range in the archive) and read only when asked for.
export class ZipFormatError extends Error {
  override name = "ZipFormatError";
}

export interface ZipEntry {
  name: string;
  /** Byte offset of the entry's data in the archive. */
  offset: number;
  /** Bytes stored (compressed size). */
  size: number;
  /** 0 stored, 8 deflated. */
  method: number;
}

/** Reads `length` bytes at `position` of the archive. */
export type ByteReader = (position: number, length: number) => Uint8Array;

const u16 = (b: Uint8Array, at: number) => b[at]! | (b[at + 1]! << 8);
const u32 = (b: Uint8Array, at: number) => (b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16)) + b[at + 3]! * 2 ** 24;
const u64 = (b: Uint8Array, at: number) => {
  const v = u32(b, at) + u32(b, at + 4) * 2 ** 32;
  if (!Number.isSafeInteger(v)) throw new ZipFormatError("a zip64 size past 2^53");
  return v;
};

/** The archive's entries by name. `size`: the archive's length in bytes. */
export function readZipDirectory(read: ByteReader, size: number): Map<string, ZipEntry> {
  const tail = Math.min(size, 22 + 65535 + 20);
  const end = read(size - tail, tail);
  let eocd = -1;
  for (let i = end.length - 22; i >= 0; i--)
    if (u32(end, i) === 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd < 0) throw new ZipFormatError("no zip directory");
  let count = u16(end, eocd + 10);
  let dirSize = u32(end, eocd + 12);
  let dirOffset = u32(end, eocd + 16);
  if ((dirOffset === 0xffffffff || count === 0xffff || dirSize === 0xffffffff) && eocd >= 20 && u32(end, eocd - 20) === 0x07064b50) {
    const z64 = u64(end, eocd - 12);
    const rec = read(z64, 56);
    if (u32(rec, 0) !== 0x06064b50) throw new ZipFormatError("a broken zip64 directory");
    count = u64(rec, 32);
    dirSize = u64(rec, 40);
    dirOffset = u64(rec, 48);
  }
  if (dirOffset + dirSize > size) throw new ZipFormatError("the zip directory runs past the end of the file");
  const dir = read(dirOffset, dirSize);
  const entries = new Map<string, ZipEntry>();
  let at = 0;
  for (let e = 0; e < count; e++) {
    if (at + 46 > dir.length || u32(dir, at) !== 0x02014b50) throw new ZipFormatError("a broken zip directory");
    const method = u16(dir, at + 10);
    let stored = u32(dir, at + 20);
    let plain = u32(dir, at + 24);
    const nameLen = u16(dir, at + 28), extraLen = u16(dir, at + 30), commentLen = u16(dir, at + 32);
    let local = u32(dir, at + 42);
    const name = new TextDecoder().decode(dir.subarray(at + 46, at + 46 + nameLen));
    // zip64 extra field: the 64-bit values of the fields saturated above, in this order
    for (let x = at + 46 + nameLen; x + 4 <= at + 46 + nameLen + extraLen; ) {
      const id = u16(dir, x), len = u16(dir, x + 2);
      if (id === 0x0001) {
        let p = x + 4;
        if (plain === 0xffffffff) {
          plain = u64(dir, p);
          p += 8;
        }
        if (stored === 0xffffffff) {
          stored = u64(dir, p);
          p += 8;
        }
        if (local === 0xffffffff) local = u64(dir, p);
      }
      x += 4 + len;
    }
    at += 46 + nameLen + extraLen + commentLen;
    const head = read(local, 30);
    if (u32(head, 0) !== 0x04034b50) throw new ZipFormatError(`${name}: a broken zip entry`);
    const offset = local + 30 + u16(head, 26) + u16(head, 28);
    if (offset + stored > size) throw new ZipFormatError(`${name}: the entry runs past the end of the file`);
    entries.set(name, { name, offset, size: stored, method });
  }
  return entries;
}
