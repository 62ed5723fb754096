// A real OpenAI client (the `openai` npm package, v4) against `xpu serve`. Run by
// TestServeOpenAIClient with the server's base URL and model id; prints one JSON object with
// what it saw, which the Go test checks.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const stream = await client.chat.completions.create({
  model, stream: true, temperature: 0, max_tokens: 16,
  messages: [{ role: "user", content: "Tell me a story." }],
});
let text = "", finish = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  const c = chunk.choices[0];
  if (c?.delta?.content) text += c.delta.content;
  if (c?.finish_reason) finish = c.finish_reason;
}
out.stream = { text, finish, chunks };

const whole = await client.chat.completions.create({
  model, temperature: 0, max_tokens: 16,
  messages: [{ role: "user", content: "Tell me a story." }],
});
out.chat = { text: whole.choices[0].message.content, finish: whole.choices[0].finish_reason,
  usage: whole.usage };

const comp = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8, temperature: 0 });
out.completion = { text: comp.choices[0].text, finish: comp.choices[0].finish_reason };

async function status(f) {
  try { await f(); return { status: 200 }; }
  catch (e) { return { status: e.status, type: e.error?.type ?? e.type, message: e.message }; }
}
out.unknownModel = await status(() => client.chat.completions.create({
  model: "no-such-model", messages: [{ role: "user", content: "hi" }] }));
out.tooManyTokens = await status(() => client.chat.completions.create({
  model, max_tokens: 1000000, messages: [{ role: "user", content: "hi" }] }));

console.log(JSON.stringify(out));
