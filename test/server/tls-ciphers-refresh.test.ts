// HTTPS cipher suites and certificate refresh (vLLM's --ssl-ciphers and --enable-ssl-refresh): a client that offers
// only a suite outside the server's list fails the handshake; replacing the key and certificate files serves the new
// certificate to the next connection, without a restart.
import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { request } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { parseServeArgs } from "../../src/cli/serve-args.js";
import { fixture, SERVER, withTlsServer } from "./tls-server.js";
import { waitFor } from "./helpers.js";


/** GET /health over TLS 1.2 with `ciphers` offered: the status and the server certificate's fingerprint, or the error. */
function health(port: number, ciphers?: string): Promise<{ status: number; fingerprint: string } | Error> {
  return new Promise((resolve) => {
    const req = request(
      { host: "127.0.0.1", port, path: "/health", rejectUnauthorized: false, agent: false, maxVersion: "TLSv1.2", ...(ciphers !== undefined ? { ciphers } : {}) },
      (res) => {
        const fingerprint = (res.socket as import("node:tls").TLSSocket).getPeerCertificate().fingerprint256;
        res.resume();
        res.on("end", () => resolve({ status: res.statusCode ?? 0, fingerprint }));
      },
    );
    req.on("error", (e) => resolve(e));
    req.end();
  });
}


describe("--ssl-ciphers", () => {
  it("a client offering only a suite outside the list fails the handshake; one in the list gets in", async () => {
    await withTlsServer({ ...SERVER, ciphers: "ECDHE-ECDSA-AES256-GCM-SHA384" }, async (port) => {
      const inList = await health(port, "ECDHE-ECDSA-AES256-GCM-SHA384");
      assert.ok(!(inList instanceof Error), String(inList));
      assert.equal(inList.status, 200);
      assert.ok((await health(port, "ECDHE-ECDSA-AES128-GCM-SHA256")) instanceof Error, "a suite outside --ssl-ciphers: refused");
    });
    // without the flag the same client gets in (Node's default list holds the suite)
    await withTlsServer(SERVER, async (port) => assert.equal(((await health(port, "ECDHE-ECDSA-AES128-GCM-SHA256")) as { status: number }).status, 200));
  });

  it("the flag: needs --ssl-certfile; a list OpenSSL knows nothing of is a usage error", () => {
    const https = { sslKeyfile: fixture("tls-key.pem"), sslCertfile: fixture("tls-cert.pem") };
    assert.equal(parseServeArgs("m", { ...https, sslCiphers: "ECDHE-ECDSA-AES256-GCM-SHA384" }, {}).tls?.ciphers, "ECDHE-ECDSA-AES256-GCM-SHA384");
    assert.throws(() => parseServeArgs("m", { ...https, sslCiphers: "NO-SUCH-CIPHER" }, {}), /--ssl-ciphers "NO-SUCH-CIPHER": no cipher suite OpenSSL knows/);
    assert.throws(() => parseServeArgs("m", { sslCiphers: "ECDHE-ECDSA-AES256-GCM-SHA384" }, {}), /--ssl-ciphers and --enable-ssl-refresh need --ssl-certfile/);
  });
});

describe("--enable-ssl-refresh", () => {
  it("replacing the key and certificate files serves the new certificate to the next connection", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-ssl-refresh-"));
    try {
      const [keyfile, certfile] = [join(dir, "key.pem"), join(dir, "cert.pem")];
      copyFileSync(fixture("tls-key.pem"), keyfile);
      copyFileSync(fixture("tls-cert.pem"), certfile);
      const args = parseServeArgs("m", { sslKeyfile: keyfile, sslCertfile: certfile, enableSslRefresh: true }, {});
      assert.deepEqual(args.tls?.refreshFrom, { keyfile, certfile });
      await withTlsServer(args.tls!, async (port) => {
        const before = await health(port);
        assert.ok(!(before instanceof Error), String(before));
        // the rogue pair's file holds its key and certificate both
        copyFileSync(fixture("mtls-rogue-client.pem"), keyfile);
        copyFileSync(fixture("mtls-rogue-client.pem"), certfile);
        let after: Awaited<ReturnType<typeof health>> = before;
        await waitFor(async () => {
          after = await health(port);
          return !(after instanceof Error) && after.fingerprint !== before.fingerprint;
        }, 5000);
        assert.equal((after as { status: number }).status, 200);
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("without the flag, the files are read once", async () => {
    const dir = mkdtempSync(join(tmpdir(), "kiln-ssl-norefresh-"));
    try {
      const [keyfile, certfile] = [join(dir, "key.pem"), join(dir, "cert.pem")];
      copyFileSync(fixture("tls-key.pem"), keyfile);
      copyFileSync(fixture("tls-cert.pem"), certfile);
      await withTlsServer(parseServeArgs("m", { sslKeyfile: keyfile, sslCertfile: certfile }, {}).tls!, async (port) => {
        const before = (await health(port)) as { fingerprint: string };
        copyFileSync(fixture("mtls-rogue-client.pem"), keyfile);
        copyFileSync(fixture("mtls-rogue-client.pem"), certfile);
        await new Promise((r) => setTimeout(r, 400));
        assert.equal(((await health(port)) as { fingerprint: string }).fingerprint, before.fingerprint);
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
