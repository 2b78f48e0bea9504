// Client certificates over HTTPS (vLLM's --ssl-ca-certs and --ssl-cert-reqs, Python's ssl CERT_NONE / CERT_OPTIONAL /
// CERT_REQUIRED): a client certificate signed by the given CA is accepted; "required" refuses a connection without
// one and one from another issuer, "optional" serves a client without one and refuses (403) one that does not verify.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { request } from "node:https";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { parseServeArgs } from "../../src/cli/serve-args.js";
import { createServer } from "../../src/server/index.js";
import type { TlsOptions } from "../../src/server/server.js";
import { FakeEngine } from "./fake-engine.js";
import { MODEL } from "./helpers.js";

const fixture = (name: string) => fileURLToPath(new URL(`../../../test/fixtures/${name}`, import.meta.url));
const pem = (name: string) => readFileSync(fixture(name), "utf8");
const SERVER = { key: pem("tls-key.pem"), cert: pem("tls-cert.pem") };
const CLIENT = { key: pem("mtls-client-key.pem"), cert: pem("mtls-client-cert.pem") };
const ROGUE = { key: pem("mtls-rogue-client.pem"), cert: pem("mtls-rogue-client.pem") };

/** GET /health over HTTPS with an optional client key and certificate: the status, or the connection's error. */
function health(port: number, client: { key: string; cert: string } | null): Promise<number | Error> {
  return new Promise((resolve) => {
    const req = request({ host: "127.0.0.1", port, path: "/health", ca: SERVER.cert, ...(client ?? {}), agent: false }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", (e) => resolve(e));
    req.end();
  });
}

async function withServer(tls: TlsOptions, fn: (port: number) => Promise<void>): Promise<void> {
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

describe("client certificates (--ssl-ca-certs, --ssl-cert-reqs)", () => {
  it("required: a certificate from the CA gets in; none, or another issuer's, is refused at the handshake", async () => {
    await withServer({ ...SERVER, ca: pem("mtls-ca.pem"), clientCerts: "required" }, async (port) => {
      assert.equal(await health(port, CLIENT), 200);
      assert.ok((await health(port, null)) instanceof Error, "no certificate: refused");
      assert.ok((await health(port, ROGUE)) instanceof Error, "a certificate the CA did not sign: refused");
    });
  });

  it("optional: a client without a certificate is served, one whose certificate does not verify gets a 403", async () => {
    await withServer({ ...SERVER, ca: pem("mtls-ca.pem"), clientCerts: "optional" }, async (port) => {
      assert.equal(await health(port, null), 200);
      assert.equal(await health(port, CLIENT), 200);
      assert.equal(await health(port, ROGUE), 403);
    });
  });

  it("the flags: 0/1/2 as Python's ssl, a CA file needed for 1 and 2, HTTPS needed for either", () => {
    const parse = (o: Record<string, unknown>) => parseServeArgs("m", o, {});
    const https = { sslKeyfile: fixture("tls-key.pem"), sslCertfile: fixture("tls-cert.pem") };
    assert.deepEqual(parse({ ...https, sslCaCerts: fixture("mtls-ca.pem"), sslCertReqs: "2" }).tls?.clientCerts, "required");
    assert.equal(parse({ ...https, sslCaCerts: fixture("mtls-ca.pem"), sslCertReqs: "1" }).tls?.clientCerts, "optional");
    assert.equal(parse({ ...https, sslCaCerts: fixture("mtls-ca.pem") }).tls?.clientCerts, "none");
    assert.throws(() => parse({ ...https, sslCertReqs: "2" }), /--ssl-cert-reqs 2 needs --ssl-ca-certs/);
    assert.throws(() => parse({ sslCaCerts: fixture("mtls-ca.pem") }), /need --ssl-certfile/);
    assert.throws(() => parse({ ...https, sslCaCerts: fixture("mtls-ca.pem"), sslCertReqs: "3" }), /--ssl-cert-reqs must be 0 \(none\), 1 \(optional\) or 2 \(required\)/);
  });
});
