// A real `nats-server` (Debian's nats-server package) on a free 127.0.0.1 port for the KV-events tests; tests skip
// with `natsSkipReason` when the binary is absent.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import * as net from "node:net";

/** Why NATS tests skip here, or false when nats-server can run. */
export const natsSkipReason: string | false = (() => {
  const r = spawnSync("nats-server", ["--version"], { encoding: "utf8" });
  return r.error !== undefined || r.status !== 0 ? "nats-server is not installed (apt-get install nats-server)" : false;
})();

export interface NatsServer {
  port: number;
  /** nats://127.0.0.1:port */
  url: string;
  stop(): Promise<void>;
}

/** A port nothing listens on right now (the kernel's pick, released). */
export async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", resolve));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return port;
}

const live = new Set<ChildProcess>();
process.on("exit", () => live.forEach((c) => c.kill("SIGKILL")));

/** Starts nats-server on `port` (a free one by default) and waits until it accepts clients. */
export async function startNatsServer(port?: number): Promise<NatsServer> {
  const p = port ?? (await freePort());
  const child = spawn("nats-server", ["-a", "127.0.0.1", "-p", String(p)], { stdio: ["ignore", "pipe", "pipe"] });
  live.add(child);
  let log = "";
  const exited = new Promise<void>((resolve) => child.on("exit", () => { live.delete(child); resolve(); }));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`nats-server did not start within 10 s:\n${log}`)), 10_000);
    const onData = (d: Buffer): void => {
      log += d.toString();
      if (log.includes("Server is ready")) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout!.on("data", onData);
    child.stderr!.on("data", onData);
    void exited.then(() => { clearTimeout(timer); reject(new Error(`nats-server exited early:\n${log}`)); });
  });
  return {
    port: p,
    url: `nats://127.0.0.1:${p}`,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}
