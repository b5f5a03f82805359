// transcript.mjs is the session of docs/mcp.md, driven from the official
// TypeScript MCP SDK: create a workspace, write a file and its tests, run
// the tests, read their output by offset, fix the file, run them again,
// fork the workspace into two copies and try a different change in each. It
// prints each call and its structured result, and exits non-zero when the
// session does not go as the transcript says.
// Usage: node transcript.mjs KUBECTL_BASHTASK KUBECONFIG NAMESPACE OWNER
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [bin, kubeconfig, ns, owner] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: bin, args: ["--kubeconfig", kubeconfig, "-n", ns, "mcp", "--owner", owner], stderr: "inherit" });
const client = new Client({ name: "transcript", version: "0.0.0" });
await client.connect(transport);

async function call(name, args) {
  console.log(`→ ${name} ${JSON.stringify(args)}`);
  const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 180000 });
  if (res.isError) {
    console.log(`← error: ${res.content.map((c) => c.text).join(" ")}`);
    process.exit(1);
  }
  console.log(`← ${JSON.stringify(res.structuredContent)}`);
  return res.structuredContent;
}

const calc = "def add(a, b):\n    return a - b\n";
const test = "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\nunittest.main()\n";
await call("workspace_create", { name: "demo", network: "None" });
await call("run", { workspace: "demo", command: "mkdir -p proj" });
await call("write_file", { workspace: "demo", path: "proj/calc.py", content: calc });
await call("write_file", { workspace: "demo", path: "proj/test_calc.py", content: test });
let r = await call("run", { workspace: "demo", working_dir: "proj", command: "python3 -B test_calc.py", tail_bytes: 120 });
if (r.exit_code !== 1) process.exit(1);
await call("read_output", { task: r.task, stream: "stderr", offset: 0, max_bytes: 200 });
await call("write_file", { workspace: "demo", path: "proj/calc.py", content: calc.replace("a - b", "a + b") });
r = await call("run", { workspace: "demo", working_dir: "proj", command: "python3 -B test_calc.py" });
if (r.exit_code !== 0) process.exit(1);
await call("list_dir", { workspace: "demo", path: "proj" });
// Two ways to write add, tried side by side in two copies of the workspace.
const f = await call("workspace_fork", { source: "demo", count: 2, name_prefix: "demo-try-" });
if (f.workspaces.length !== 2) process.exit(1);
const [a, b] = f.workspaces.map((w) => w.name);
await call("write_file", { workspace: a, path: "proj/calc.py", content: "def add(a, b):\n    return sum((a, b))\n" });
r = await call("run", { workspace: a, working_dir: "proj", command: "python3 -B test_calc.py", tail_bytes: 20 });
if (r.exit_code !== 0) process.exit(1);
await call("write_file", { workspace: b, path: "proj/calc.py", content: "def add(a, b):\n    return int(f'{a}{b}')\n" });
r = await call("run", { workspace: b, working_dir: "proj", command: "python3 -B test_calc.py", tail_bytes: 20 });
if (r.exit_code !== 1) process.exit(1);
r = await call("read_file", { workspace: "demo", path: "proj/calc.py" });
if (r.content !== calc.replace("a - b", "a + b")) process.exit(1);
for (const name of [a, b, "demo"]) {
  await call("workspace_delete", { name });
}
await client.close();
