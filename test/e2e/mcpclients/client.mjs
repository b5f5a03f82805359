// client.mjs drives `kubectl-bashtask mcp` over stdio from the official
// TypeScript MCP SDK, calling each tool once, and exits non-zero at the
// first result that is not what it should be.
// Usage: node client.mjs KUBECTL_BASHTASK KUBECONFIG NAMESPACE OWNER OTHER
// OTHER names a workspace of owner o2 in NAMESPACE, which the tools must
// refuse whatever owner the model names.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [bin, kubeconfig, ns, owner, otherOwnerWorkspace] = process.argv.slice(2);
if (!otherOwnerWorkspace) {
  console.error("usage: node client.mjs KUBECTL_BASHTASK KUBECONFIG NAMESPACE OWNER OTHER");
  process.exit(2);
}
const transport = new StdioClientTransport({ command: bin, args: ["--kubeconfig", kubeconfig, "-n", ns, "mcp", "--owner", owner], stderr: "inherit" });
const client = new Client({ name: "e2e-typescript", version: "0.0.0" });
await client.connect(transport);

function check(what, ok, got) {
  if (!ok) {
    console.error(`FAIL ${what}: ${JSON.stringify(got)}`);
    process.exit(1);
  }
  console.log(`ok ${what}`);
}

async function call(name, args, opts) {
  const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 180000, ...opts });
  if (res.isError) {
    throw new Error(`${name}: tool error: ${res.content.map((c) => c.text).join(" ")}`);
  }
  return res.structuredContent;
}

async function refused(name, args) {
  const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 180000 });
  return res.isError ? res.content.map((c) => c.text).join(" ") : "";
}

const tools = (await client.listTools()).tools.map((t) => t.name).sort();
check("tools/list", tools.join(",") === "cancel,list_dir,read_file,read_output,run,start,workspace_create,workspace_delete,workspace_fork,workspace_resume,workspace_suspend,write_file,write_stdin", tools);

let r = await call("workspace_create", { name: "ts1", network: "None", owner: "someone-else" });
check("workspace_create", r.phase === "Ready", r);
r = await call("write_file", { workspace: "ts1", path: "t.sh", content: "echo from-ts\n", executable: true });
check("write_file", r.size === 13, r);
r = await call("read_file", { workspace: "ts1", path: "t.sh" });
check("read_file", r.content === "echo from-ts\n", r);
r = await call("list_dir", { workspace: "ts1" });
check("list_dir", r.entries.some((e) => e.name === "t.sh" && e.type === "file" && e.mode === "755"), r);

let progress = 0;
r = await call("run", { workspace: "ts1", command: "./t.sh; sleep 2.5", owner: "someone-else" }, { onprogress: () => progress++ });
check("run", r.exit_code === 0 && r.stdout === "from-ts\n" && r.stdout_bytes === 8, r);
check("run progress notifications", progress > 0, progress);

r = await call("start", { workspace: "ts1", command: "read line; echo got:$line", stdin: true });
const task = r.task;
r = await call("write_stdin", { task, data: "x\n", close: true });
check("write_stdin", r.offset === 2, r);
let out = "";
let offset = 0;
for (let i = 0; i < 30; i++) {
  r = await call("read_output", { task, offset, wait_seconds: 5 });
  out += r.data;
  offset = r.next_offset;
  if (r.finished && offset === r.total_bytes) break;
}
check("read_output", out === "got:x\n", { out, r });

r = await call("start", { workspace: "ts1", command: "sleep 100" });
const long = r.task;
r = await call("cancel", { task: long });
check("cancel", r.task === long, r);

// A request the client aborts cancels its task.
const ac = new AbortController();
setTimeout(() => ac.abort(), 2000);
let aborted = false;
try {
  await call("run", { workspace: "ts1", command: "sleep 300" }, { signal: ac.signal });
} catch (e) {
  aborted = true;
}
check("run aborted by the client", aborted, aborted);

const res = await client.readResource({ uri: "bashtask://ts1/t.sh" });
check("resources/read", res.contents[0].text === "echo from-ts\n", res);

// Two copies, each changed its own way; the source keeps its file. The
// owner the model gives is ignored; out-of-range counts, a missing source
// and another owner's source are tool errors.
r = await call("workspace_fork", { source: "ts1", count: 2, name_prefix: "ts1-try-", owner: "someone-else" });
check("workspace_fork", r.source === "ts1" && r.workspaces.length === 2 && r.workspaces.every((w) => w.phase === "Ready" && w.name.startsWith("ts1-try-")), r);
for (const w of r.workspaces) {
  const c = await call("run", { workspace: w.name, command: `echo echo ${w.name} > t.sh; ./t.sh` });
  check(`run in copy ${w.name}`, c.stdout === `${w.name}\n`, c);
}
const copies = r.workspaces.map((w) => w.name);
r = await call("read_file", { workspace: "ts1", path: "t.sh" });
check("the source after its copies changed", r.content === "echo from-ts\n", r);
let forkMsg = await refused("workspace_fork", { source: "ts1", count: 17 });
check("workspace_fork count out of range", forkMsg.includes("count 17 is out of range: 1 to 16"), forkMsg);
forkMsg = await refused("workspace_fork", { source: "nope" });
check("workspace_fork of a missing source", forkMsg.includes('"nope" not found'), forkMsg);
for (const [name, args] of [["workspace_fork", { source: otherOwnerWorkspace }], ["run", { workspace: otherOwnerWorkspace, command: "true" }], ["read_file", { workspace: otherOwnerWorkspace, path: "x" }]]) {
  const msg = await refused(name, { ...args, owner: "o2" });
  check(`${name} of another owner's workspace`, msg.includes(`workspace ${otherOwnerWorkspace} belongs to owner "o2"`), msg);
}
for (const name of copies) {
  r = await call("workspace_delete", { name });
  check(`workspace_delete ${name}`, r.phase === "Deleted", r);
}

r = await call("workspace_suspend", { name: "ts1" });
check("workspace_suspend", r.phase === "Suspended", r);
r = await call("workspace_resume", { name: "ts1" });
check("workspace_resume", r.phase === "Ready", r);
const msg = await refused("run", { workspace: "nope", command: "true" });
check("a tool error a model can act on", msg.includes("nope"), msg);
r = await call("workspace_delete", { name: "ts1" });
check("workspace_delete", r.phase === "Deleted", r);
await client.close();
