// deploy/k8s: every file parses as YAML and is in the kustomization, and the objects fit together: the router's
// flags parse as `kiln router` parses them, its selector picks the kiln-serve pods (not its own) on their port, its
// service account may get, list and watch pods, the workers' probes are on /health, the Service reaches the router.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { parseAllDocuments } from "yaml";
import { parseRouterArgs, registerRouterCommand } from "../../src/cli/router-command.js";
import { matchesSelector } from "../../src/router/pod-discovery.js";

const dir = fileURLToPath(new URL("../../../deploy/k8s", import.meta.url)); // dist/test/router -> package root

interface Probe {
  httpGet?: { path: string; port: string | number };
}
interface Container {
  name: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: { fieldRef?: { fieldPath: string } } }[];
  ports?: { name?: string; containerPort: number }[];
  readinessProbe?: Probe;
  livenessProbe?: Probe;
  startupProbe?: Probe;
}
interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; labels?: Record<string, string> };
  spec?: {
    selector?: { matchLabels?: Record<string, string> } & Record<string, string>;
    template?: { metadata: { labels: Record<string, string> }; spec: { serviceAccountName?: string; containers: Container[] } };
    ports?: { port: number; targetPort: string | number }[];
  };
  rules?: { apiGroups: string[]; resources: string[]; verbs: string[] }[];
  subjects?: { kind: string; name: string; namespace?: string }[];
  roleRef?: { kind: string; name: string };
  resources?: string[];
  namespace?: string;
}

function load(): Map<string, K8sObject[]> {
  const files = new Map<string, K8sObject[]>();
  for (const name of readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort()) {
    const docs = parseAllDocuments(readFileSync(join(dir, name), "utf8"));
    for (const d of Array.isArray(docs) ? docs : [docs]) assert.deepEqual(d.errors, [], `${name}: ${d.errors.join("; ")}`);
    files.set(name, (Array.isArray(docs) ? docs : [docs]).map((d) => d.toJS() as K8sObject).filter((o) => o !== null));
  }
  return files;
}

/** `kiln router`'s config for a container's args (after "router"), as the CLI parses them. */
function routerConfig(args: string[]) {
  const program = new Command().exitOverride();
  registerRouterCommand(program);
  const cmd = program.commands.find((c) => c.name() === "router")!;
  cmd.exitOverride().configureOutput({ writeErr: () => {} }).action(() => {});
  program.parse(["node", "kiln", ...args]);
  return parseRouterArgs(cmd.opts());
}

const portOf = (c: Container, port: string | number): number => (typeof port === "number" ? port : c.ports!.find((p) => p.name === port)!.containerPort);

describe("deploy/k8s manifests", () => {
  const files = load();
  const all = [...files.values()].flat();
  const one = (kind: string, name: string): K8sObject => {
    const found = all.filter((o) => o.kind === kind && o.metadata?.name === name);
    assert.equal(found.length, 1, `one ${kind} ${name}`);
    return found[0]!;
  };

  it("parse as YAML; the kustomization lists every manifest", () => {
    const kustomization = files.get("kustomization.yaml")![0]!;
    assert.equal(kustomization.kind, "Kustomization");
    assert.deepEqual([...kustomization.resources!].sort(), [...files.keys()].filter((f) => f !== "kustomization.yaml").sort());
    assert.deepEqual(all.filter((o) => o.kind !== "Kustomization").map((o) => `${o.kind}/${o.metadata.name}`).sort(), [
      "Deployment/kiln-router", "Deployment/kiln-serve", "Namespace/kiln", "Role/kiln-router-pods", "RoleBinding/kiln-router-pods", "Service/kiln-router", "ServiceAccount/kiln-router",
    ]);
    assert.equal(one("Namespace", "kiln").metadata.name, kustomization.namespace);
  });

  it("the router may get, list and watch pods under its own service account", () => {
    const router = one("Deployment", "kiln-router");
    const account = router.spec!.template!.spec.serviceAccountName!;
    one("ServiceAccount", account);
    const binding = one("RoleBinding", "kiln-router-pods");
    assert.deepEqual(binding.subjects, [{ kind: "ServiceAccount", name: account, namespace: "kiln" }]);
    const role = one(binding.roleRef!.kind, binding.roleRef!.name);
    assert.ok(role.rules!.some((r) => r.apiGroups.includes("") && r.resources.includes("pods") && ["get", "list", "watch"].every((v) => r.verbs.includes(v))));
  });

  it("the router's flags parse; its selector picks the kiln-serve pods (not its own) on their port, in its namespace", () => {
    const router = one("Deployment", "kiln-router");
    const serve = one("Deployment", "kiln-serve");
    const [container] = router.spec!.template!.spec.containers;
    assert.deepEqual(container!.env!.find((e) => e.name === "POD_NAMESPACE")!.valueFrom, { fieldRef: { fieldPath: "metadata.namespace" } });
    // the kubelet expands $(POD_NAMESPACE) in args
    const config = routerConfig(container!.args!.map((a) => a.replace("$(POD_NAMESPACE)", "kiln")));
    assert.equal(config.serviceDiscovery, true);
    assert.deepEqual(config.workerUrls, []);
    assert.equal(config.serviceDiscoveryNamespace, "kiln");
    assert.equal(config.host, "0.0.0.0");
    const workerPods = serve.spec!.template!.metadata.labels;
    assert.ok(matchesSelector(workerPods, config.selector), "the selector matches the kiln-serve pods");
    assert.ok(!matchesSelector(router.spec!.template!.metadata.labels, config.selector), "and not the router's own pods");
    const [kiln] = serve.spec!.template!.spec.containers;
    assert.equal(portOf(kiln!, "http"), config.serviceDiscoveryPort);
    assert.deepEqual(kiln!.args!.slice(0, 1), ["serve"]);
    assert.equal(kiln!.args![kiln!.args!.indexOf("--port") + 1], String(config.serviceDiscoveryPort));
    assert.equal(kiln!.args![kiln!.args!.indexOf("--host") + 1], "0.0.0.0");
    // the Service reaches the router's port
    const service = one("Service", "kiln-router");
    assert.ok(matchesSelector(router.spec!.template!.metadata.labels, service.spec!.selector as Record<string, string>));
    assert.equal(portOf(container!, service.spec!.ports![0]!.targetPort), config.port);
  });

  it("Deployments select their own pods; the workers' probes are on /health at their port", () => {
    for (const name of ["kiln-serve", "kiln-router"]) {
      const d = one("Deployment", name);
      assert.ok(matchesSelector(d.spec!.template!.metadata.labels, d.spec!.selector!.matchLabels!), name);
    }
    const [kiln] = one("Deployment", "kiln-serve").spec!.template!.spec.containers;
    for (const probe of [kiln!.readinessProbe, kiln!.livenessProbe, kiln!.startupProbe]) {
      assert.equal(probe?.httpGet?.path, "/health");
      assert.equal(portOf(kiln!, probe.httpGet.port), 8000);
    }
  });
});
