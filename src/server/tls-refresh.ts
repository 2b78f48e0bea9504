// vLLM's --enable-ssl-refresh (its SSLCertRefresher): the HTTPS key, certificate and CA files are watched, and when
// one changes the server's secure context is rebuilt from them, so new connections get the new certificate without
// a restart (connections already open keep theirs). A half-written pair that does not load is skipped, said.
import { readFileSync, watch, type FSWatcher } from "node:fs";
import * as path from "node:path";
import type { SecureContextOptions } from "node:tls";

/** The files the TLS settings were read from. */
export interface TlsFiles {
  keyfile: string;
  certfile: string;
  caCerts?: string;
}

/** What the watcher rebuilds: the https server's setSecureContext. */
interface SecureServer {
  setSecureContext(options: SecureContextOptions): void;
}

/**
 * Watches `files` (their directories, so that a file replaced by a rename, as cert-manager and certbot do, is seen)
 * and, on a change, re-reads them into `server` with `fixed` (ciphers and the like). Returns the stopper.
 */
export function watchTlsFiles(server: SecureServer, files: TlsFiles, fixed: SecureContextOptions, warn: (line: string) => void): () => void {
  const watched = [files.keyfile, files.certfile, ...(files.caCerts !== undefined ? [files.caCerts] : [])].map((f) => path.resolve(f));
  let timer: NodeJS.Timeout | null = null;
  const reload = (): void => {
    timer = null;
    try {
      const key = readFileSync(files.keyfile, "utf8");
      const cert = readFileSync(files.certfile, "utf8");
      const ca = files.caCerts !== undefined ? readFileSync(files.caCerts, "utf8") : undefined;
      server.setSecureContext({ ...fixed, key, cert, ...(ca !== undefined ? { ca } : {}) });
    } catch (e) {
      warn(`[tls] --enable-ssl-refresh: the changed key/certificate files do not load, the previous ones stay: ${(e as Error).message}`);
    }
  };
  const watchers: FSWatcher[] = [...new Set(watched.map((f) => path.dirname(f)))].map((dir) =>
    watch(dir, (_event, name) => {
      if (name === null || !watched.includes(path.join(dir, name.toString()))) return;
      // a key and a certificate are written one after the other: reload once both settle
      if (timer !== null) clearTimeout(timer);
      timer = setTimeout(reload, 100);
    }),
  );
  return () => {
    if (timer !== null) clearTimeout(timer);
    for (const w of watchers) w.close();
  };
}
