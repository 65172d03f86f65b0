// Drives the official Ollama JavaScript library against a gateway, for
// tests/integration/test_ollama_js.py:  node ollama_js_client.mjs <ollama module dir> <host> <key> <scenario> [model]
// Prints one JSON object: what the library gave back (or the error it threw).
const [moduleDir, host, key, scenario, model = "reasoning"] = process.argv.slice(2);
const { Ollama } = await import(`${moduleDir}/dist/index.mjs`);
const client = new Ollama({ host, headers: { Authorization: `Bearer ${key}` } });
const out = {};

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

try {
  if (scenario === "stream") {
    const parts = await collect(await client.chat({
      model, stream: true, messages: [{ role: "user", content: "[stub reasoning=2 content=6]" }],
    }));
    out.content = parts.map((p) => p.message.content).join("");
    out.thinking = parts.map((p) => p.message.thinking ?? "").join("");
    out.roles = [...new Set(parts.map((p) => p.message.role))];
    out.last = parts[parts.length - 1];
  } else if (scenario === "tools") {
    const tools = [{ type: "function", function: { name: "get_weather", description: "weather",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
    const messages = [{ role: "user", content: "[stub agent chain=get_weather]" }];
    const first = await collect(await client.chat({ model, stream: true, messages, tools }));
    const calls = first.flatMap((p) => p.message.tool_calls ?? []);
    out.calls = calls;
    messages.push({ role: "assistant", content: "", tool_calls: calls });
    for (const call of calls) {
      messages.push({ role: "tool", content: "12 C and sunny", tool_name: call.function.name });
    }
    const second = await collect(await client.chat({ model, stream: true, messages, tools }));
    out.answer = second.map((p) => p.message.content).join("");
    out.done = second[second.length - 1].done;
  } else if (scenario === "error") {
    await client.chat({ model: "llama3", messages: [{ role: "user", content: "hi" }] });
  } else if (scenario === "midstream") {
    await collect(await client.chat({
      model, stream: true, messages: [{ role: "user", content: "[stub reasoning=0 content=20 fail_after=3]" }],
    }));
  } else if (scenario === "abort") {
    const stream = await client.chat({
      model, stream: true, messages: [{ role: "user", content: "[stub reasoning=0 content=400 delay_ms=30]" }],
    });
    for await (const part of stream) {
      out.first = part.message.content;
      stream.abort();
    }
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
} catch (err) {
  out.error = { name: err.name, message: err.message, status: err.status_code ?? null };
}
console.log(JSON.stringify(out));
