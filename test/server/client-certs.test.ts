// Client certificates over HTTPS (vLLM's --ssl-ca-certs and --ssl-cert-reqs, Python's ssl CERT_NONE / CERT_OPTIONAL /
// CERT_REQUIRED): a client certificate signed by the given CA is accepted; "required" refuses a connection without
// one and one from another issuer, "optional" serves a client without one and refuses (403) one that does not verify.
import assert from "node:assert/strict";
import { request } from "node:https";
import { describe, it } from "node:test";
import { parseServeArgs } from "../../src/cli/serve-args.js";
import { fixture, pem, SERVER, withTlsServer } from "./tls-server.js";

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


describe("client certificates (--ssl-ca-certs, --ssl-cert-reqs)", () => {
  it("required: a certificate from the CA gets in; none, or another issuer's, is refused at the handshake", async () => {
    await withTlsServer({ ...SERVER, ca: pem("mtls-ca.pem"), clientCerts: "required" }, async (port) => {
      assert.equal(await health(port, CLIENT), 200);
      assert.ok((await health(port, null)) instanceof Error, "no certificate: refused");
      assert.ok((await health(port, ROGUE)) instanceof Error, "a certificate the CA did not sign: refused");
    });
  });

  it("optional: a client without a certificate is served, one whose certificate does not verify gets a 403", async () => {
    await withTlsServer({ ...SERVER, ca: pem("mtls-ca.pem"), clientCerts: "optional" }, async (port) => {
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
