// ollama's own client (the `ollama` npm package) against the ollama API of `xpu serve`. Run
// by TestServeOllamaClient with the server's URL and model name; prints one JSON object with
// what it saw, which the Go test checks.
import { Ollama } from "ollama";

const [host, model] = process.argv.slice(2);
const client = new Ollama({ host });
const out = {};

out.version = (await (await fetch(host + "/api/version")).json()).version; // the client has no version()
const tags = await client.list();
out.models = tags.models.map((m) => m.name);

const gen = await client.generate({ model, prompt: "Once upon a time", stream: false,
  options: { temperature: 0, num_predict: 12 } });
out.generate = { text: gen.response, done: gen.done, evalCount: gen.eval_count, reason: gen.done_reason };

let text = "", parts = 0, last = null;
const stream = await client.chat({ model, stream: true, options: { temperature: 0, num_predict: 12 },
  messages: [{ role: "user", content: "Tell me a story." }] });
for await (const part of stream) {
  parts++;
  text += part.message.content;
  last = part;
}
out.chatStream = { text, parts, done: last.done, evalCount: last.eval_count };

const whole = await client.chat({ model, stream: false, options: { temperature: 0, num_predict: 12 },
  messages: [{ role: "user", content: "Tell me a story." }] });
out.chat = { text: whole.message.content, role: whole.message.role };

const show = await client.show({ model });
out.show = { family: show.details.family };

try {
  await client.generate({ model: "nope", prompt: "x", stream: false });
  out.unknownModel = "no error";
} catch (e) {
  out.unknownModel = String(e.message);
}
console.log(JSON.stringify(out));
