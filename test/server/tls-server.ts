// HTTPS test fixtures: the committed key/certificate PEMs (test/fixtures) and a fake-engine server over TLS.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { createServer } from "../../src/server/index.js";
import type { TlsOptions } from "../../src/server/server.js";
import { FakeEngine } from "./fake-engine.js";
import { MODEL } from "./helpers.js";

export const fixture = (name: string) => fileURLToPath(new URL(`../../../test/fixtures/${name}`, import.meta.url));
export const pem = (name: string) => readFileSync(fixture(name), "utf8");
/** The server's key and self-signed certificate. */
export const SERVER = { key: pem("tls-key.pem"), cert: pem("tls-cert.pem") };

/** Runs `fn` with the port of a fake-engine server listening over HTTPS with `tls`, closed after it. */
export async function withTlsServer(tls: TlsOptions, fn: (port: number) => Promise<void>): Promise<void> {
  const engine = new FakeEngine();
  const app = createServer({ engine, tokenizer: engine.tokenizer, servedModelNames: [MODEL], maxModelLen: engine.maxModelLen, version: "0.1.0-test", https: tls });
  await app.listen({ port: 0, host: "127.0.0.1" });
  try {
    await fn((app.server.address() as { port: number }).port);
  } finally {
    const c = app.close();
    app.server.closeAllConnections();
    await c;
  }
}
